package compress

import (
	"encoding/binary"
	"math/bits"
)

// A dictionary's content is chosen by COVER (Liao, Petri, Moffat and
// Wirth, "Effective Construction of Relative Lempel-Ziv Dictionaries",
// WWW 2016), the algorithm of zstd's own trainer (`zstd --train`;
// facebook/zstd, lib/dictBuilder/cover.c at 020b960, COVER_group,
// COVER_selectSegment and COVER_buildDictionary: one epoch per k bytes of
// the dictionary, visited in turn). The samples are cut into epochs, and each
// epoch gives in turn the segment of k bytes whose d-byte substrings
// (dmers) are worth the most: a dmer is worth the number of samples it
// occurs in (a dictionary helps only a sample's first use of it: zstd
// finds the later ones in the sample itself), and nothing once a chosen
// segment holds it. The segments fill the dictionary from its end, where
// zstd reaches them at the shortest offsets, until it is full or no
// segment is worth anything (there, cover.c at that commit still copies
// d-1 bytes of an empty segment and goes on; this stops).
//
// On package corpus it takes a 1.4 KiB payment-intent answer to about
// 305 bytes where the hashed-substring builder of
// github.com/klauspost/compress/dict took it to 425
// (TestTrainedDictionaryCompresses; docs/performance.md, "Memory per
// stored answer").

// coverParams are a segment size k and a dmer size d to try.
type coverParams struct{ k, d int }

// coverDs and coverKs are the dmer and segment sizes Train tries, every
// pair of them, keeping the pair whose content compresses a quarter of the
// samples, left out of its training, the smallest (as zstd's trainer
// searches d of 6 and 8 and k up to 2048: cover.c,
// COVER_optimizeTrainFromBuffer). On the corpus the best k is 1024 or 2048
// for every class, by 1 % over 256.
var (
	coverDs = [...]int{8, 6}
	coverKs = [...]int{256, 1024, 2048}
)

// coverDefault are the parameters Train uses without a trial, when the
// samples are too few to leave a quarter out.
var coverDefault = coverParams{1024, 8}

// coverContent returns at most size bytes of dictionary content chosen
// from samples by COVER with p, the most valuable segments last.
func coverContent(samples [][]byte, size int, p coverParams) []byte {
	x := newDmerIndex(samples, p.d)
	if x == nil {
		return nil
	}
	return x.content(size, p.k)
}

// dmerIndex is what COVER knows of samples for one dmer size: their bytes
// end to end, the id of the dmer at each position, and what each id is
// worth, the samples it occurs in. Trials of several segment sizes share
// it.
type dmerIndex struct {
	all    []byte
	d      int
	dmerAt []uint32
	freq   []uint32
}

// newDmerIndex indexes the dmers of d bytes of samples, or returns nil when
// they are too short or d is not 1 to 8.
func newDmerIndex(samples [][]byte, d int) *dmerIndex {
	var all []byte
	ends := make([]int, len(samples)) // each sample's end in all
	for i, s := range samples {
		all = append(all, s...)
		ends[i] = len(all)
	}
	// A dmer is read as 8 bytes, of which its d are kept, so positions
	// stop 8 bytes before the end.
	positions := len(all) - 7
	if positions <= 0 || d < 1 || d > 8 {
		return nil
	}
	mask := ^uint64(0) >> (64 - 8*d)
	x := &dmerIndex{all: all, d: d, dmerAt: make([]uint32, positions)}
	ids := newDmerIDs(positions)
	var lastSample []int32
	sample := 0
	for pos := range positions {
		for pos >= ends[sample] {
			sample++
		}
		id, seen := ids.id(binary.LittleEndian.Uint64(all[pos:])&mask, uint32(len(x.freq)))
		if !seen {
			x.freq = append(x.freq, 0)
			lastSample = append(lastSample, -1)
		}
		x.dmerAt[pos] = id
		if lastSample[id] != int32(sample) {
			lastSample[id] = int32(sample)
			x.freq[id]++
		}
	}
	return x
}

// content returns at most size bytes of dictionary content chosen with
// segments of k bytes, the most valuable last.
func (x *dmerIndex) content(size, k int) []byte {
	if k < x.d {
		return nil
	}
	freq := append([]uint32(nil), x.freq...) // chosen segments zero their dmers
	positions := len(x.dmerAt)
	dict := make([]byte, size)
	tail := size
	epochs := max(1, min(size/k, positions))
	epochSize := positions / epochs
	inWindow := make([]uint32, len(freq)) // occurrences of each dmer in the window
	for epoch := 0; tail > 0; epoch = (epoch + 1) % epochs {
		begin, end, ok := bestSegment(x.dmerAt, freq, inWindow, epoch*epochSize, (epoch+1)*epochSize, k-x.d+1)
		if !ok {
			break
		}
		// The segment's dmers are in the dictionary: worth nothing now.
		for pos := begin; pos < end; pos++ {
			freq[x.dmerAt[pos]] = 0
		}
		n := min(end-begin+x.d-1, tail) // the segment's bytes: its last dmer's run to its end
		tail -= n
		copy(dict[tail:], x.all[begin:begin+n])
	}
	return dict[tail:]
}

// dmerIDs numbers dmers in the order they are first seen: an open
// addressing table, several times faster than a map over the millions of
// positions of a few hundred list answers.
type dmerIDs struct {
	keys  []uint64
	ids   []uint32 // id+1; 0 is an empty slot
	count int
	shift uint
}

func newDmerIDs(hint int) *dmerIDs {
	t := &dmerIDs{}
	t.resize(max(1024, hint/4))
	return t
}

func (t *dmerIDs) resize(atLeast int) {
	size := 1 << bits.Len(uint(2*atLeast-1)) // a power of two, at most half full
	keys, ids := t.keys, t.ids
	t.keys, t.ids, t.shift = make([]uint64, size), make([]uint32, size), uint(64-bits.Len(uint(size-1)))
	for i, id := range ids {
		if id != 0 {
			t.place(keys[i], id)
		}
	}
}

func (t *dmerIDs) slot(key uint64) int { return int((key * 0x9e3779b97f4a7c15) >> t.shift) }

func (t *dmerIDs) place(key uint64, id uint32) {
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		if t.ids[i] == 0 {
			t.keys[i], t.ids[i] = key, id
			return
		}
	}
}

// id returns key's id, giving it next when it has none yet (seen false).
func (t *dmerIDs) id(key uint64, next uint32) (id uint32, seen bool) {
	mask := len(t.keys) - 1
	for i := t.slot(key); ; i = (i + 1) & mask {
		switch {
		case t.ids[i] == 0:
			t.keys[i], t.ids[i] = key, next+1
			if t.count++; 2*t.count > len(t.keys) {
				t.resize(len(t.keys))
			}
			return next, false
		case t.keys[i] == key:
			return t.ids[i] - 1, true
		}
	}
}

// bestSegment slides a window of dmers positions (a segment of k bytes
// holds k-d+1 dmers) over the positions from begin to end and returns the
// window worth the most, less the positions at either end whose dmers are
// worth nothing; ok is false when no window is worth anything. inWindow is
// all zeros on entry and on return.
func bestSegment(dmerAt, freq, inWindow []uint32, begin, end, dmers int) (segBegin, segEnd int, ok bool) {
	var worth, best uint64
	lo, hi := begin, begin
	for hi < end {
		id := dmerAt[hi]
		if inWindow[id] == 0 {
			worth += uint64(freq[id])
		}
		inWindow[id]++
		hi++
		if hi-lo > dmers {
			id := dmerAt[lo]
			lo++
			if inWindow[id]--; inWindow[id] == 0 {
				worth -= uint64(freq[id])
			}
		}
		if worth > best {
			best, segBegin, segEnd = worth, lo, hi
		}
	}
	for pos := lo; pos < hi; pos++ {
		inWindow[dmerAt[pos]] = 0
	}
	if best == 0 {
		return 0, 0, false
	}
	for segBegin < segEnd && freq[dmerAt[segBegin]] == 0 {
		segBegin++
	}
	for segEnd > segBegin && freq[dmerAt[segEnd-1]] == 0 {
		segEnd--
	}
	return segBegin, segEnd, true
}
