//go:build !linux || !cgo

package chunkplace

// Plugin is unavailable in this build.
type Plugin struct{}

// Open reports ErrUnsupported: this build has no cgo (or is not for Linux).
func Open(Spec) (*Plugin, error) { return nil, ErrUnsupported }

// Items asks for no item (never reached: Open fails).
func (*Plugin) Items() []uint64 { return nil }

// Place rejects every heap (never reached: Open fails).
func (*Plugin) Place(_, _ uint64, _ []uint64) (chunk, pos, off uint64, ok bool) {
	return 0, 0, 0, false
}

// Close does nothing.
func (*Plugin) Close() {}
