// Package sizing says how much Redis memory a policy set needs at a given
// rate of protected first writes, from the bytes per record measured on
// generated answers (internal/testing/corpus) by TestMemoryPerRecord
// (internal/redisstore), which also holds this table to the measurement.
package sizing

import (
	"fmt"
	"time"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/policy"
)

// Class is a kind of answer the table has a column for, named as the
// generator of the measured answers (internal/testing/corpus) names it.
type Class string

// Classes lists the classes in the table's order, the generator's
// (TestClassesAreTheCorpus): a 1.2 KiB payment-intent-like object, a
// 17 KiB list of 14 of them, a 280-byte error body, and a mix of objects
// mostly, lists of up to 64 KiB and errors.
var Classes = []Class{"object", "list", "error", "mixed"}

// Mode is how a policy stores its answers.
type Mode string

// The modes a policy's compression settings give.
const (
	Uncompressed Mode = "uncompressed"
	// Auto, Zstd and S2 compress with the built-in dictionary, as
	// compression.mode names them.
	Auto    Mode = "auto"
	Zstd    Mode = "zstd"
	S2      Mode = "s2"
	Trained Mode = "trained"
)

// Modes lists the modes in the table's order.
var Modes = []Mode{Uncompressed, Auto, Zstd, S2, Trained}

// PerRecord is Redis used_memory per completed record, in bytes, by class
// of answer and mode: redis 7.0.15 (jemalloc 5.3.0), 2,000 records per
// figure, the key, keyspace and expiry entries and the allocator's size
// classes included. docs/performance.md, "Memory per stored answer".
var PerRecord = map[Class]map[Mode]float64{
	"object": {Uncompressed: 1806, Auto: 1041, Zstd: 905, S2: 1040, Trained: 544},
	"list":   {Uncompressed: 20624, Auto: 4240, Zstd: 4240, S2: 6287, Trained: 3738},
	"error":  {Uncompressed: 684, Auto: 492, Zstd: 474, S2: 492, Trained: 304},
	"mixed":  {Uncompressed: 7667, Auto: 2044, Zstd: 1973, S2: 2546, Trained: 1581},
}

// sealOverhead is what sealing adds to a stored response: the envelope's
// version, key id (up to 64 bytes; 8 assumed) and length, a 24-byte nonce
// and a 16-byte tag (package seal), rounded up for the allocator.
const sealOverhead = 64

// ModeOf is the mode p stores its answers in.
func ModeOf(p *policy.Policy) Mode {
	switch {
	case p.Compression.Mode == compress.Off || p.Compression.Codec == nil:
		return Uncompressed
	case p.Compression.Dictionary != "":
		return Trained
	case p.Compression.Mode == compress.Zstd:
		return Zstd
	case p.Compression.Mode == compress.S2:
		return S2
	}
	return Auto
}

// Row is one policy's need.
type Row struct {
	Policy    string
	Mode      Mode
	Retention time.Duration
	// Rate is first writes per second; Records how many completed
	// records the retention keeps at that rate.
	Rate    float64
	Records float64
	// Bytes is used_memory per class of answer.
	Bytes map[Class]float64
}

// Estimate is p's need at rate first writes per second.
func Estimate(p *policy.Policy, rate float64) Row {
	r := Row{Policy: p.Name, Mode: ModeOf(p), Retention: p.Retention, Rate: rate,
		Records: rate * p.Retention.Seconds(), Bytes: map[Class]float64{}}
	for _, c := range Classes {
		per := PerRecord[c][r.Mode]
		if p.Encrypt {
			per += sealOverhead
		}
		r.Bytes[c] = per * r.Records
	}
	return r
}

// Human writes a byte count in the largest binary unit below it.
func Human(b float64) string {
	for _, u := range []struct {
		name string
		size float64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b >= u.size {
			return fmt.Sprintf("%.1f %s", b/u.size, u.name)
		}
	}
	return fmt.Sprintf("%.0f B", b)
}
