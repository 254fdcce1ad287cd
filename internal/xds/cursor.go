package xds

import (
	"errors"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

var (
	errTruncated = errors.New("unexpected end of message")
	errEndGroup  = errors.New("mismatching end group marker")
	errWireType  = errors.New("reserved wire type")
)

// cursor reads a message where gRPC received it, in the buffers of its
// frames (a mem.BufferSlice), and copies out only what it is asked for. It
// reads as proto.Unmarshal does: the same varints, tags and lengths are
// accepted and rejected.
type cursor struct {
	cur  []byte          // the unread rest of the current buffer
	next mem.BufferSlice // the buffers after it
	left int             // unread bytes in all
}

func newCursor(data mem.BufferSlice) *cursor { return &cursor{next: data, left: data.Len()} }

// fill makes cur hold the next unread bytes, if any are left.
func (c *cursor) fill() {
	for len(c.cur) == 0 && len(c.next) > 0 {
		c.cur, c.next = c.next[0].ReadOnlyData(), c.next[1:]
	}
}

// read copies the next len(dst) bytes into dst; the caller has checked
// that they are there.
func (c *cursor) read(dst []byte) {
	for len(dst) > 0 {
		c.fill()
		n := copy(dst, c.cur)
		c.cur, dst, c.left = c.cur[n:], dst[n:], c.left-n
	}
}

// skip passes over the next n bytes.
func (c *cursor) skip(n int) error {
	if n > c.left {
		return errTruncated
	}
	for c.left -= n; n > 0; {
		c.fill()
		k := min(n, len(c.cur))
		c.cur, n = c.cur[k:], n-k
	}
	return nil
}

// varint reads a varint as protowire.ConsumeVarint does, across buffers.
func (c *cursor) varint() (uint64, error) {
	c.fill()
	if v, n := protowire.ConsumeVarint(c.cur); n > 0 {
		c.cur, c.left = c.cur[n:], c.left-n
		return v, nil
	}
	var b [10]byte // the longest varint
	k := copy(b[:], c.cur)
	for _, buf := range c.next {
		if k == len(b) {
			break
		}
		k += copy(b[k:], buf.ReadOnlyData())
	}
	v, n := protowire.ConsumeVarint(b[:k])
	if n < 0 {
		return 0, protowire.ParseError(n)
	}
	return v, c.skip(n)
}

// tag reads a field's tag. A message's own fields must have a number in
// range (proto.Unmarshal); a group's need only be positive
// (protowire.ConsumeTag).
func (c *cursor) tag(group bool) (protowire.Number, protowire.Type, error) {
	v, err := c.varint()
	if err != nil {
		return 0, 0, err
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber || (!group && num > protowire.MaxValidNumber) {
		return 0, 0, errFieldNumber
	}
	return num, typ, nil
}

// length reads the length of a length-delimited field, checked against
// what is left.
func (c *cursor) length() (int, error) {
	n, err := c.varint()
	if err != nil {
		return 0, err
	}
	if n > uint64(c.left) {
		return 0, errTruncated
	}
	return int(n), nil
}

// skipValue passes over a field's value as protowire.ConsumeFieldValue
// does, groups included.
func (c *cursor) skipValue(num protowire.Number, typ protowire.Type, depth int) error {
	switch typ {
	case protowire.VarintType:
		_, err := c.varint()
		return err
	case protowire.Fixed32Type:
		return c.skip(4)
	case protowire.Fixed64Type:
		return c.skip(8)
	case protowire.BytesType:
		n, err := c.length()
		if err != nil {
			return err
		}
		return c.skip(n)
	case protowire.StartGroupType:
		return c.skipGroup(num, depth)
	case protowire.EndGroupType:
		return errEndGroup
	}
	return errWireType
}

func (c *cursor) skipGroup(num protowire.Number, depth int) error {
	if depth < 0 {
		return errDepth
	}
	for {
		num2, typ2, err := c.tag(true)
		if err != nil {
			return err
		}
		if typ2 == protowire.EndGroupType {
			if num2 != num {
				return errEndGroup
			}
			return nil
		}
		if err := c.skipValue(num2, typ2, depth-1); err != nil {
			return err
		}
	}
}
