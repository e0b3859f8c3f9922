package compress

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// Dictionary is a zstd dictionary: the built-in one, or one trained on a
// route's own answers (Train) and named in a policy.
type Dictionary struct {
	id uint32
	// raw is the dictionary as its file holds it (zstd's dictionary
	// format), or, for the built-in one, its bare content.
	raw    []byte
	isRaw  bool
	source string
}

// ID is the dictionary's id, which every frame compressed with it names.
func (d *Dictionary) ID() uint32 { return d.id }

// Source says where the dictionary came from, for messages.
func (d *Dictionary) Source() string { return d.source }

// Size is the dictionary's length in bytes.
func (d *Dictionary) Size() int { return len(d.raw) }

func (d *Dictionary) encoderOption() zstd.EOption {
	if d.isRaw {
		return zstd.WithEncoderDictRaw(d.id, d.raw)
	}
	return zstd.WithEncoderDict(d.raw)
}

func (d *Dictionary) decoderOption() zstd.DOption {
	if d.isRaw {
		return zstd.WithDecoderDictRaw(d.id, d.raw)
	}
	return zstd.WithDecoderDicts(d.raw)
}

// dictMagic starts a dictionary in zstd's format (RFC 8878 §5,
// Magic_Number 0xEC30A437, little-endian), followed by its 4-byte id.
const dictMagic = 0xEC30A437

// Ids a trained dictionary may have. RFC 8878 §5 leaves every id to
// private use and reserves, for dictionaries shared in public, those up
// to 32767 and from 2^31; the trained ones keep out of both, and of the
// built-in one's.
const (
	MinTrainedID = 32768
	MaxTrainedID = 1<<31 - 1
)

// ParseDictionary reads a dictionary in zstd's format, as Train and
// `zstd --train` write it. source names it in messages (its file).
func ParseDictionary(source string, b []byte) (*Dictionary, error) {
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != dictMagic {
		return nil, fmt.Errorf("%s: not a zstd dictionary (it must start with the magic number 0xEC30A437; make one with `idem-extproc compress train`)", source)
	}
	info, err := zstd.InspectDictionary(b)
	if err != nil {
		return nil, fmt.Errorf("%s: not a usable zstd dictionary: %w", source, err)
	}
	id := info.ID()
	if id < MinTrainedID || id > MaxTrainedID {
		return nil, fmt.Errorf("%s: dictionary id %d is outside %d to %d (the ids below are the built-in dictionary's "+
			"and those reserved by RFC 8878 §5)", source, id, MinTrainedID, MaxTrainedID)
	}
	if info.ContentSize() == 0 {
		return nil, fmt.Errorf("%s: the dictionary has no content", source)
	}
	return &Dictionary{id: id, raw: append([]byte(nil), b...), source: source}, nil
}

// Train builds a dictionary of at most maxSize bytes from samples: the
// contents (idem.AppendContents) of a route's own answers, a few hundred
// of them or more. id must be within MinTrainedID to MaxTrainedID and new
// to the policy's dictionaries: rotating a dictionary means a new id.
//
// Its content is chosen by COVER (cover.go) with the parameters of
// bestCoverParams, each tried as a raw dictionary, without entropy tables;
// the dictionary's own tables, built once for the parameters kept, are
// github.com/klauspost/compress/zstd's (BuildDict), for zstd's fastest
// level, the one the server compresses at.
func Train(samples [][]byte, id uint32, maxSize int) ([]byte, error) {
	if id < MinTrainedID || id > MaxTrainedID {
		return nil, fmt.Errorf("compress: dictionary id %d is outside %d to %d", id, MinTrainedID, MaxTrainedID)
	}
	if len(samples) < 8 {
		return nil, fmt.Errorf("compress: %d samples are too few to train a dictionary; give a few hundred", len(samples))
	}
	if maxSize < 256 {
		return nil, errors.New("compress: a dictionary of fewer than 256 bytes cannot hold zstd's tables")
	}
	total := 0
	for _, s := range samples {
		total += len(s)
	}
	if total > maxTrainingBytes {
		return nil, fmt.Errorf("compress: the samples come to %d bytes, more than the %d a dictionary is trained on; give fewer",
			total, maxTrainingBytes)
	}
	p := coverDefault
	if len(samples) >= minTrialSamples {
		p = bestCoverParams(samples, id, maxSize)
	}
	return buildDictionary(samples, coverContent(samples, maxSize, p), id, maxSize)
}

// bestCoverParams tries every pair of coverDs and coverKs on three
// quarters of samples and returns the one whose content compresses the
// other quarter the smallest, coverDefault when none finds anything.
func bestCoverParams(samples [][]byte, id uint32, maxSize int) coverParams {
	var train, held [][]byte
	for i, s := range samples {
		if i%4 == 3 {
			held = append(held, s)
		} else {
			train = append(train, s)
		}
	}
	p, best := coverDefault, -1
	for _, d := range coverDs {
		x := newDmerIndex(train, d) // shared by the segment sizes
		if x == nil {
			return p
		}
		for _, k := range coverKs {
			content := x.content(maxSize, k)
			if len(content) < 8 {
				continue // this size finds nothing worth keeping; another may
			}
			trial := &Dictionary{id: id, raw: content, isRaw: true, source: "trial"}
			if n, err := compressedSize(trial, held); err == nil && (best < 0 || n < best) {
				p, best = coverParams{k: k, d: d}, n
			}
		}
	}
	return p
}

// minTrialSamples is the fewest samples Train tries parameters on: a
// quarter of them, left out of the training, must be enough to judge by.
const minTrialSamples = 32

// maxTrainingBytes bounds the samples Train reads: COVER keeps a 4-byte
// dmer id for every byte of them.
const maxTrainingBytes = 256 << 20

// buildDictionary makes a dictionary of at most maxSize bytes in zstd's
// format: content (COVER's), and the entropy tables and repeat
// offsets zstd's dictionary format holds (RFC 8878 §5; the offsets are
// the 1, 4 and 8 every frame starts from, §3.1.2.5). When the tables push
// it past maxSize, the content loses as many bytes from its front, where
// its least valuable segments are.
func buildDictionary(samples [][]byte, content []byte, id uint32, maxSize int) ([]byte, error) {
	for {
		if len(content) < 8 {
			return nil, errors.New("compress: the samples repeat too little to make a dictionary of; give more, or larger, answers")
		}
		raw, err := zstd.BuildDict(zstd.BuildDictOptions{ID: id, Contents: samples, History: content,
			Offsets: [3]int{1, 4, 8}, Level: zstd.SpeedFastest})
		if err != nil {
			return nil, fmt.Errorf("compress: the samples repeat too little to train a dictionary on (%w); give more, or larger, answers", err)
		}
		if len(raw) <= maxSize {
			return raw, nil
		}
		content = content[min(len(raw)-maxSize, len(content)):]
	}
}

// compressedSize is the bytes the server's encoder makes of samples with
// the dictionary d.
func compressedSize(d *Dictionary, samples [][]byte) (int, error) {
	enc, err := zstd.NewWriter(nil, encoderOptions(d)...)
	if err != nil {
		return 0, err
	}
	defer enc.Close()
	n := 0
	var frame []byte
	for _, s := range samples {
		frame = enc.EncodeAll(s, frame[:0])
		n += len(frame)
	}
	return n, nil
}
