package spead

import "errors"

// Reason classifies why a packet or descriptor was rejected, for per-reason drop counters.
type Reason uint8

// Rejection reasons. ReasonNone means no error; ReasonOther is an error that did not come from this package.
const (
	ReasonNone Reason = iota
	ReasonShortHeader
	ReasonBadMagic
	ReasonBadVersion
	ReasonUnsupportedFlavour
	ReasonItemsPastEnd
	ReasonMissingHeapCnt
	ReasonMissingPayloadOffset
	ReasonMissingPayloadLength
	ReasonPayloadPastEnd
	ReasonPayloadPastHeap
	ReasonSizeMismatch
	ReasonDescriptorNoID
	ReasonDescriptorFragmented
	ReasonDescriptorItemPastHeap
	ReasonDescriptorBadField
	ReasonOther
	// NumReasons sizes a counter array indexed by Reason.
	NumReasons
)

var reasonNames = [NumReasons]string{
	ReasonNone:                   "none",
	ReasonShortHeader:            "short header",
	ReasonBadMagic:               "bad magic",
	ReasonBadVersion:             "bad version",
	ReasonUnsupportedFlavour:     "unsupported flavour",
	ReasonItemsPastEnd:           "item pointers past end",
	ReasonMissingHeapCnt:         "missing heap cnt",
	ReasonMissingPayloadOffset:   "missing payload offset",
	ReasonMissingPayloadLength:   "missing payload length",
	ReasonPayloadPastEnd:         "payload past packet end",
	ReasonPayloadPastHeap:        "payload past heap length",
	ReasonSizeMismatch:           "trailing bytes after payload",
	ReasonDescriptorNoID:         "descriptor without id",
	ReasonDescriptorFragmented:   "descriptor not in one packet",
	ReasonDescriptorItemPastHeap: "descriptor item past heap",
	ReasonDescriptorBadField:     "descriptor bad shape or format",
	ReasonOther:                  "other",
}

func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// reasonError is the type of every sentinel error below: comparable by identity for errors.Is, and carrying
// its Reason so counters need no string matching.
type reasonError struct {
	reason Reason
	msg    string
}

func (e *reasonError) Error() string { return e.msg }

func newReasonError(r Reason, msg string) error { return &reasonError{reason: r, msg: msg} }

// Sentinel errors, one per Reason. Decode returns them unwrapped so that rejecting a packet never allocates;
// ParseDescriptor wraps them with context.
var (
	ErrShortHeader            = newReasonError(ReasonShortHeader, "spead: packet shorter than its 8-byte header")
	ErrBadMagic               = newReasonError(ReasonBadMagic, "spead: bad magic (want 0x53)")
	ErrBadVersion             = newReasonError(ReasonBadVersion, "spead: bad version (want 4)")
	ErrUnsupportedFlavour     = newReasonError(ReasonUnsupportedFlavour, "spead: unsupported flavour (want SPEAD-64-40 or SPEAD-64-48)")
	ErrItemsPastEnd           = newReasonError(ReasonItemsPastEnd, "spead: item pointers run past the packet end")
	ErrMissingHeapCnt         = newReasonError(ReasonMissingHeapCnt, "spead: no immediate heap cnt item")
	ErrMissingPayloadOffset   = newReasonError(ReasonMissingPayloadOffset, "spead: no immediate payload offset item")
	ErrMissingPayloadLength   = newReasonError(ReasonMissingPayloadLength, "spead: no immediate payload length item")
	ErrPayloadPastEnd         = newReasonError(ReasonPayloadPastEnd, "spead: payload length runs past the packet end")
	ErrPayloadPastHeap        = newReasonError(ReasonPayloadPastHeap, "spead: payload offset+length exceeds heap length")
	ErrSizeMismatch           = newReasonError(ReasonSizeMismatch, "spead: bytes left over after the payload")
	ErrDescriptorNoID         = newReasonError(ReasonDescriptorNoID, "spead: item descriptor has no descriptor id")
	ErrDescriptorFragmented   = newReasonError(ReasonDescriptorFragmented, "spead: item descriptor does not fit in one packet")
	ErrDescriptorItemPastHeap = newReasonError(ReasonDescriptorItemPastHeap, "spead: item descriptor field runs past its heap")
	ErrDescriptorBadField     = newReasonError(ReasonDescriptorBadField, "spead: item descriptor shape or format is not a whole number of fields")
)

// ReasonOf maps an error from this package (wrapped or not) to its Reason: ReasonNone for nil, ReasonOther
// for errors from elsewhere.
func ReasonOf(err error) Reason {
	if err == nil {
		return ReasonNone
	}
	// The direct assertion keeps the common, unwrapped case free of allocation.
	if re, ok := err.(*reasonError); ok {
		return re.reason
	}
	var re *reasonError
	if errors.As(err, &re) {
		return re.reason
	}
	return ReasonOther
}
