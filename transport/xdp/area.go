package xdp

import "github.com/ibvbridge/ibvbridge/transport"

// AreaSource opens a Source whose UMEM is the ring's packet area, so the kernel copies (or, in zero-copy
// mode, the NIC writes) frames straight into the ring's data file.
type AreaSource struct{ Config Config }

var _ transport.AreaSource = AreaSource{}

// AreaSize implements transport.AreaSource: the UMEM the configuration needs.
func (a AreaSource) AreaSize() int { return RequiredUMEM(a.Config) }

// Open implements transport.AreaSource.
func (a AreaSource) Open(area []byte) (transport.Source, error) {
	s, err := Open(a.Config, area)
	if err != nil {
		return nil, err // not a typed nil in a non-nil interface
	}
	return s, nil
}
