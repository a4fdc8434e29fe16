package ringsim

import (
	"fmt"
	"math/rand/v2"
)

// OpKind is one thing a scenario does.
type OpKind int

const (
	OpAttach    OpKind = iota // a consumer says hello: independent, member of a group, or observer
	OpDetach                  // releases what it looked at, then closes its socket
	OpDie                     // closes its socket without releasing (kill -9)
	OpRead                    // looks at up to N positions, handing out its own (held until released)
	OpRelease                 // Mode 0: everything looked at; 1: its oldest held heap only
	OpSleep                   // announces it waits (wake_at = read + 1, consumer_waiting = 1)
	OpBogusTail               // writes a cursor past head (Mode 0) or behind its released one (1)
	OpBogusRead               // a member writes a read outside [tail, head]
	OpThief                   // a member releases its share unread (read = tail = head, handed unchanged)
	OpStop                    // SIGSTOP: the consumer stops moving
	OpResume                  // SIGCONT
	OpPublish                 // the producer publishes N heaps
	OpEOS                     // the end-of-stream marker
)

var opNames = [...]string{"attach", "detach", "die", "read", "release", "sleep", "bogus-tail", "bogus-read",
	"thief", "stop", "resume", "publish", "eos"}

// Op is one step of a scenario. C names a consumer by the order it attached in (0, 1, …).
type Op struct {
	K        OpKind
	C        int
	N        int
	Group    uint32
	Minor    uint16
	Start    uint32
	Mode     int
	Observer bool
}

func (o Op) String() string {
	switch o.K {
	case OpAttach:
		if o.Observer {
			return fmt.Sprintf("attach#%d observer", o.C)
		}
		return fmt.Sprintf("attach#%d group=%#x minor=%d start=%d", o.C, o.Group, o.Minor, o.Start)
	case OpPublish:
		return fmt.Sprintf("publish %d", o.N)
	case OpEOS:
		return "eos"
	case OpRead:
		return fmt.Sprintf("read#%d %d", o.C, o.N)
	}
	return fmt.Sprintf("%s#%d mode=%d", opNames[o.K], o.C, o.Mode)
}

// Scenario is a ring's shape and the operations played on it.
type Scenario struct {
	Seed   uint64
	Slots  uint64
	Rows   int
	Policy Policy
	P0     uint64
	Ops    []Op // a fixed script; nil: generated from Seed
	// LappedSpec makes 2.2 members skip lapped descriptors as §14.4 first worded it (read = head −
	// slot_count + 1); otherwise read = head − slot_count, the first position whose descriptor is still
	// current (§14.4 as it reads now).
	LappedSpec bool
}

// Describe is the scenario's shape in one line.
func (s Scenario) Describe() string {
	return fmt.Sprintf("seed %d: %d slots, %d rows, %s, start %d", s.Seed, s.Slots, s.Rows, s.Policy, s.P0)
}

// NoBogusRead leaves out members writing a read outside [tail, head] (a known divergence's switch).
var NoBogusRead bool

// KeepOneUnderBlock leaves, under block, the last attached consumer attached (no detach, death or bogus
// cursor for it): a known divergence's switch (what a block producer does with nobody attached).
var KeepOneUnderBlock bool

// NoWrap starts every generated scenario's cursors at 0 (SIM_NO_WRAP=1), to look past a producer's
// defect near 2^64 at the rest.
var NoWrap bool

// ScenarioFor derives a ring's shape from a seed.
func ScenarioFor(seed uint64) Scenario {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	s := Scenario{Seed: seed, Slots: 1 << (1 + r.IntN(4)), Rows: 2 + r.IntN(6), Policy: Policy(r.IntN(2))}
	if r.IntN(2) == 0 {
		s.P0 = -uint64(1 + r.IntN(int(3*s.Slots)))
	}
	if NoWrap {
		s.P0 = 0
	}
	return s
}

// gen generates a scenario's operations from its seed, looking at the model (what is attached, pending).
type gen struct {
	r      *rand.Rand
	s      Scenario
	groups []uint32
	n      int // consumers attached so far (actor ids)
	eos    bool
}

func newGen(s Scenario) *gen {
	r := rand.New(rand.NewPCG(s.Seed, 0x2545f4914f6cdd1d))
	g := &gen{r: r, s: s}
	for range 1 + r.IntN(2) {
		g.groups = append(g.groups, 0x1000+uint32(r.IntN(1<<20))) // any non-zero id is a group (spec §14.1)
	}
	return g
}

func (g *gen) next(m *Model, acts []*actor) Op {
	r := g.r
	var live, moving []int
	members := 0
	for i, a := range acts {
		if a.live && !a.observer {
			live = append(live, i)
			if !a.stopped {
				moving = append(moving, i)
			}
			if a.group != 0 {
				members++
			}
		}
	}
	freeRow := len(live) < len(m.rows)
	pick := func(from []int) int { return from[r.IntN(len(from))] }
	lastOne := KeepOneUnderBlock && m.policy == Block && len(m.attached) <= 1
	for {
		x := r.IntN(100)
		switch {
		case x < 8 || len(live) == 0:
			if !freeRow || g.eos {
				if len(live) == 0 {
					if g.eos {
						return Op{K: OpResume} // nothing left to do: a no-op
					}
					return Op{K: OpPublish, N: 1}
				}
				continue
			}
			op := Op{K: OpAttach, C: g.n, Minor: 2, Start: uint32(r.IntN(2))}
			g.n++
			switch y := r.IntN(20); {
			case y < 1:
				op.Observer = true
			case y < 8:
			default:
				op.Group = g.groups[r.IntN(len(g.groups))]
				if r.IntN(5) == 0 {
					op.Minor = 1
				}
			}
			return op
		case x < 33:
			if m.IsPending() || g.eos {
				continue
			}
			return Op{K: OpPublish, N: 1 + r.IntN(int(m.N))}
		case x < 58:
			if len(moving) == 0 {
				continue
			}
			return Op{K: OpRead, C: pick(moving), N: 1 + r.IntN(int(m.N)+1)}
		case x < 74:
			if len(moving) == 0 {
				continue
			}
			return Op{K: OpRelease, C: pick(moving), Mode: r.IntN(2)}
		case x < 79:
			if len(moving) == 0 {
				continue
			}
			return Op{K: OpSleep, C: pick(moving)}
		case x < 83:
			if len(live) == 0 || lastOne {
				continue
			}
			return Op{K: OpDetach, C: pick(live)}
		case x < 86:
			if len(live) == 0 || lastOne {
				continue
			}
			return Op{K: OpDie, C: pick(live)}
		case x < 90:
			if len(moving) == 0 || len(moving) == 1 && m.policy == Block {
				continue
			}
			return Op{K: OpStop, C: pick(moving)}
		case x < 95:
			var stopped []int
			for _, i := range live {
				if acts[i].stopped {
					stopped = append(stopped, i)
				}
			}
			if len(stopped) == 0 {
				continue
			}
			return Op{K: OpResume, C: pick(stopped)}
		case x < 96:
			if len(live) == 0 || lastOne {
				continue
			}
			return Op{K: OpBogusTail, C: pick(live), Mode: r.IntN(2)}
		case x < 97:
			if members == 0 || NoBogusRead {
				continue
			}
			return Op{K: OpBogusRead, C: pick(live), Mode: r.IntN(2)}
		case x < 98:
			if members == 0 {
				continue
			}
			return Op{K: OpThief, C: pick(live)}
		default:
			if g.eos || r.IntN(20) != 0 {
				continue
			}
			if m.policy == Block {
				if ok, _, _ := m.canPublish(m.head); !ok || m.IsPending() || len(m.attached) == 0 {
					continue
				}
			}
			g.eos = true
			return Op{K: OpEOS}
		}
	}
}
