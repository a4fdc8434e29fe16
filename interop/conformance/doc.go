// Package conformance owns the producer conformance suite: one set of tests, with real processes, run
// against the Go producer (ring.Producer in a child process, and recv for the end-to-end reproductions),
// the C producer (ibvb-produce) and the Python producer (python -m ibvbridge.produce), checking what spec
// docs/ring-layout.md §7 and §14 promise by counts: a heap read by a consumer paused mid-heap under real
// overruns is reported invalid, never verified as another heap's bytes; an interrupted blocked producer
// wakes at once; a detached consumer's region is unmapped at the detach; a group member's death, its row's
// reuse and strangers joining a group are settled as §14.7 says. Each guard has a test-only mutant switch
// (IBVBRIDGE_TEST_MUTANT) and a test proving the suite catches the mutant.
package conformance
