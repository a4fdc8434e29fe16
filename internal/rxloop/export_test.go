package rxloop

// PollOnce exposes one poll round to the external tests (package rxloop_test, which may import
// rxlooptest): it returns the round as a function over a loop built as Run builds it.
func PollOnce(q Queue, st *Stats, batch int, frame func(uint64, []byte)) func() (int, error) {
	return newLoop(q, st, batch, frame).pollOnce
}
