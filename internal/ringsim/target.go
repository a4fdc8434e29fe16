package ringsim

// Target is one implementation of the producer the simulation plays operations against: the model, or a
// driver of a real producer. Consumers are played by the harness through the target's memory (region
// stores, descriptor and row loads), as a real client would.
type Target interface {
	Name() string
	// Attach says hello (role 1 with a group or none; role 2 observer when observer) and returns the row,
	// its generation and the start position the producer stored in the region's tail.
	Attach(group uint32, minor uint16, start uint32, observer bool) (row int, gen uint32, tail uint64, status int, err error)
	// Close closes a consumer's socket and returns once its row no longer says attached.
	Close(row int, gen uint32) error
	// Publish publishes one heap, or the end-of-stream marker; want is the model's result (a block
	// publish the model says waits is given a moment, then reported Pending and left running).
	Publish(eos bool, want Result) (Result, error)
	// Settle forces a cursor read, and waits for a pending publish to end when want says it has.
	Settle(want Outcome) error
	Observe() Outcome
	Head() uint64
	Desc(q uint64) (seq, mask uint64, eos bool)
	RowState(row int) (state, gen uint32)
	Store(row int, f Field, v uint64)
	Shutdown()
}

// modelTarget is the model as a Target.
type modelTarget struct{ *Model }

func (t modelTarget) Name() string { return "model" }

func (t modelTarget) Attach(group uint32, minor uint16, start uint32, observer bool) (int, uint32, uint64, int, error) {
	if observer {
		return -1, 0, 0, StatusOK, nil
	}
	r, g, s, st := t.Model.Attach(group, minor, start)
	return r, g, s, st, nil
}

func (t modelTarget) Close(row int, gen uint32) error { t.Gone(row); return nil }

func (t modelTarget) Publish(eos bool, _ Result) (Result, error) { return t.Model.Publish(eos), nil }

func (t modelTarget) Settle(Outcome) error { t.Model.Settle(); return nil }

func (t modelTarget) Shutdown() {}
