package config

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

// compressionCfg is the compression group as written.
type compressionCfg struct {
	// Mode is auto (the default), zstd, s2 or off.
	Mode scalar `yaml:"mode,omitempty"`
	// Dictionary is a zstd dictionary file trained on the route's answers
	// (`idem-extproc compress train`); relative to the policy file.
	Dictionary scalar `yaml:"dictionary,omitempty"`
	// PreviousDictionaries are dictionaries used before, kept so that the
	// records they compressed still expand.
	PreviousDictionaries scalars `yaml:"previous_dictionaries,omitempty"`
}

var compressionModes = enum[compress.Mode]{{"auto", compress.Auto}, {"zstd", compress.Zstd}, {"s2", compress.S2},
	{"off", compress.Off}}

// compression parses the compression group: compression.mode,
// compression.dictionary, compression.previous_dictionaries. The files
// are read and checked by codecs, once every policy is known.
func (b *builder) compression(r *policy.Compression, s *settings, path string) {
	c := &s.Compression
	if v := c.Mode; v.Set {
		r.Mode = oneOf(b, v, path+".compression.mode", compressionModes)
	}
	if v := c.Dictionary; v.Set {
		if strings.TrimSpace(v.Value) == "" {
			b.errorf(v.Line, path+".compression.dictionary", "empty; name a zstd dictionary file or leave the setting out")
		}
		r.Dictionary = v.Value
		b.dictLines[r.Dictionary] = v.Line
	}
	if v := c.PreviousDictionaries; v.Set {
		r.PreviousDictionaries = nil
		for i, f := range v.Items {
			if strings.TrimSpace(f.Value) == "" {
				b.errorf(f.Line, fmt.Sprintf("%s.compression.previous_dictionaries[%d]", path, i), "empty")
				continue
			}
			r.PreviousDictionaries = append(r.PreviousDictionaries, f.Value)
			b.dictLines[f.Value] = f.Line
		}
	}
}

// maxDictionaryFile caps a dictionary file: `idem-extproc compress train`
// makes them 16 KiB unless told otherwise, and a dictionary far larger
// than the answers it compresses only costs memory.
const maxDictionaryFile = 1 << 20

// codecs gives every policy of the set its compression codec: one per
// distinct set of dictionaries, shared by the policies that name the same
// files. A dictionary file that cannot be read, is not a zstd
// dictionary, or has the id of another of its policy's dictionaries is
// reported at the line that names it.
func (b *builder) codecs(set *policy.Set, paths []string) {
	dicts := map[string]*compress.Dictionary{}
	load := func(file, path string) *compress.Dictionary {
		if d, ok := dicts[file]; ok {
			return d
		}
		full := file
		if !filepath.IsAbs(full) {
			full = filepath.Join(filepath.Dir(b.file), file)
		}
		data, err := safefile.Read(full, maxDictionaryFile)
		var d *compress.Dictionary
		if err == nil {
			d, err = compress.ParseDictionary(file, data)
		}
		if err != nil {
			b.errorf(b.dictLines[file], path, "%v", err)
		}
		dicts[file] = d
		return d
	}
	shared := map[string]*compress.Codec{}
	for i, p := range set.Policies {
		c := &p.Compression
		opts := compress.Options{}
		ok := true
		if c.Dictionary != "" {
			opts.Dictionary = load(c.Dictionary, paths[i]+".compression.dictionary")
			ok = opts.Dictionary != nil
		}
		for j, f := range c.PreviousDictionaries {
			d := load(f, fmt.Sprintf("%s.compression.previous_dictionaries[%d]", paths[i], j))
			ok = ok && d != nil
			opts.Previous = append(opts.Previous, d)
		}
		if !ok {
			continue
		}
		key := fmt.Sprint(c.Mode, "\x00", c.Dictionary, "\x00", strings.Join(c.PreviousDictionaries, "\x00"))
		codec, seen := shared[key]
		if !seen {
			opts.Mode = c.Mode
			var err error
			if codec, err = compress.New(opts); err != nil {
				line := b.dictLines[c.Dictionary]
				for _, f := range c.PreviousDictionaries {
					line = max(line, b.dictLines[f])
				}
				b.errorf(line, paths[i]+".compression", "%v", err)
				continue
			}
			shared[key] = codec
		}
		c.Codec = codec
	}
}
