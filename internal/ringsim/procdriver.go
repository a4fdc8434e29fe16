package ringsim

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// ProcDriver plays scenarios against a producer run by a driver program (the Python producer's
// clients/python/tests/sim_driver.py, the C producer's clients/c/build/sim_driver): the program publishes
// and reclaims on command (one line each way), the harness plays the consumers through the ring's socket
// and memory as for the Go producer.
type ProcDriver struct {
	*rawRing
	name   string
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	p0     uint64
	policy Policy
	pend   bool
	dead   error
}

// NewProcDriver starts argv (with env added) and creates ring "sim" in dir with s's shape.
func NewProcDriver(name string, argv, env []string, dir string, s Scenario) (*ProcDriver, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(cmd.Environ(), env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s driver: %w", name, err)
	}
	d := &ProcDriver{name: name, cmd: cmd, in: in, out: bufio.NewReader(outp), p0: s.P0, policy: s.Policy}
	ans, err := d.ask(fmt.Sprintf("create %s %d %d %s %d", dir, s.Slots, s.Rows, s.Policy, s.P0))
	if err != nil || !strings.HasPrefix(ans, "ok ") {
		d.Shutdown()
		return nil, fmt.Errorf("%s driver: create: %q %v %s", name, ans, err, stderr.String())
	}
	if d.rawRing, err = openRaw(strings.TrimPrefix(ans, "ok "), s.Slots, s.Rows); err != nil {
		d.Shutdown()
		return nil, err
	}
	return d, nil
}

func (d *ProcDriver) Name() string { return d.name }

// ask sends one command and reads its answer, within hangAfter.
func (d *ProcDriver) ask(line string) (string, error) {
	if d.dead != nil {
		return "", d.dead
	}
	if _, err := io.WriteString(d.in, line+"\n"); err != nil {
		d.dead = fmt.Errorf("%s driver: %w", d.name, err)
		return "", d.dead
	}
	type answer struct {
		s   string
		err error
	}
	c := make(chan answer, 1)
	go func() {
		s, err := d.out.ReadString('\n')
		c <- answer{strings.TrimSpace(s), err}
	}()
	select {
	case a := <-c:
		if a.err != nil {
			d.dead = fmt.Errorf("%s driver: %q: %w", d.name, line, a.err)
		}
		return a.s, d.dead
	case <-time.After(d.patience(line)):
		d.dead = fmt.Errorf("%s driver: %q not answered in %v (a loop?)", d.name, line, d.patience(line))
		return "", d.dead
	}
}

// patience is how long a command may take: create starts an interpreter (numpy's import, on a busy
// machine); everything else is bounded by the producer's own loops.
func (d *ProcDriver) patience(line string) time.Duration {
	if strings.HasPrefix(line, "create") {
		return 60 * time.Second
	}
	return hangAfter + 2*time.Second
}

func parseResult(s string) (Result, bool, error) {
	switch s {
	case "published":
		return Published, false, nil
	case "dropped":
		return Dropped, false, nil
	case "full":
		return Full, false, nil
	case "pending":
		return Pending, true, nil
	}
	return 0, false, fmt.Errorf("driver answered %q", s)
}

func (d *ProcDriver) Publish(eos bool, want Result) (Result, error) {
	wait := hangAfter.Milliseconds()
	if d.policy == Block && want == Pending {
		wait = 5
	}
	ans, err := d.ask(fmt.Sprintf("publish %d %d", btoi(eos), wait))
	if err != nil {
		return 0, err
	}
	r, pend, err := parseResult(ans)
	if pend && (d.policy == Drop || want != Pending) {
		d.dead = fmt.Errorf("%s driver: the publish did not return in %v (drop never waits; a loop?)", d.name, hangAfter)
		return 0, d.dead
	}
	d.pend = pend
	return r, err
}

func (d *ProcDriver) Settle(want Outcome) error {
	if d.pend {
		wait := int64(5)
		if !want.Pending {
			wait = hangAfter.Milliseconds()
		}
		ans, err := d.ask(fmt.Sprintf("await %d", wait))
		if err != nil {
			return err
		}
		r, pend, err := parseResult(ans)
		if err != nil {
			return err
		}
		if pend && !want.Pending {
			return fmt.Errorf("a block publish still waits %v after the model published it", hangAfter)
		}
		if !pend && r != Published {
			return fmt.Errorf("the waiting publish ended %v; the model published it", r)
		}
		d.pend = pend
	}
	if _, err := d.ask("unread"); err != nil {
		return err
	}
	if d.pend {
		for deadline := time.Now().Add(400 * time.Millisecond); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
			if u32(d.ctl, ctlBlockedOn).Load() == want.BlockedOn {
				break
			}
		}
	}
	return nil
}

func (d *ProcDriver) Observe() Outcome {
	o := d.observe()
	o.Pending = d.pend
	if !d.pend && d.dead == nil && caughtUp(o) {
		if ans, err := d.ask("free"); err == nil {
			fmt.Sscan(ans, &o.Free)
		}
	}
	d.masks(&o, d.p0)
	return o
}

func (d *ProcDriver) Shutdown() {
	if d.rawRing != nil {
		d.close()
	}
	if d.dead == nil {
		d.ask("quit")
	}
	d.in.Close()
	done := make(chan error, 1)
	go func() { done <- d.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = d.cmd.Process.Kill()
		<-done
	}
}
