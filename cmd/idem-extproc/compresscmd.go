package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/idem-extproc/idem-extproc/internal/compress"
	"github.com/idem-extproc/idem-extproc/internal/idem"
	"github.com/idem-extproc/idem-extproc/internal/policy"
	"github.com/idem-extproc/idem-extproc/internal/safefile"
)

func compressCommand(e env) *cobra.Command {
	cmd := groupCommand("compress", "Train the zstd dictionaries that compress a policy's stored answers", e)
	var (
		id   uint32
		out  string
		size int
	)
	train := &cobra.Command{
		Use:   "train --id ID --out FILE SAMPLE...",
		Short: "Train a dictionary on samples of a route's answers",
		Long: "Train a zstd dictionary on samples of one route's answers, for a policy's compression.dictionary.\n" +
			"Each SAMPLE is a file holding one answer, either its body alone or the whole HTTP response as\n" +
			"`curl -si` prints it (status line, headers, blank line, body): the headers a record keeps are\n" +
			"compressed with the body, so samples with headers train a better dictionary. A directory stands\n" +
			"for the files in it. Give a few hundred answers or more. The id names the dictionary in every\n" +
			"record it compresses: a new dictionary for a policy needs a new id, and the old one stays in\n" +
			"compression.previous_dictionaries for one retention.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("--out is required")
			}
			samples, err := readSamples(args)
			if err != nil {
				fmt.Fprintf(e.stderr, "%v\n", err)
				return exitFailure
			}
			dict, err := compress.Train(samples, id, size)
			if err != nil {
				fmt.Fprintf(e.stderr, "%v\n", err)
				return exitFailure
			}
			if err := os.WriteFile(out, dict, 0o644); err != nil {
				fmt.Fprintf(e.stderr, "%v\n", err)
				return exitFailure
			}
			fmt.Fprintf(e.stdout, "wrote %s: dictionary %d, %d bytes, trained on %d answers\n", out, id, len(dict), len(samples))
			return nil
		},
	}
	train.Flags().Uint32Var(&id, "id", 0, fmt.Sprintf("the dictionary's id, %d to %d, new to the policy", compress.MinTrainedID, compress.MaxTrainedID))
	train.Flags().StringVar(&out, "out", "", "the dictionary file to write")
	train.Flags().IntVar(&size, "size", 16<<10, "the dictionary's largest size in bytes")
	cmd.AddCommand(train)
	return cmd
}

// readSamples reads each answer as a record would keep it
// (idem.AppendContents): an HTTP response's stored headers and body, or a
// body alone.
func readSamples(paths []string) ([][]byte, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.Type().IsRegular() {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	samples := make([][]byte, 0, len(files))
	for _, f := range files {
		data, err := safefile.Read(f, maxSampleFile)
		if err != nil {
			return nil, err
		}
		resp, err := sampleAnswer(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		samples = append(samples, idem.AppendContents(nil, &resp))
	}
	return samples, nil
}

// maxSampleFile caps one sample file at what Train reads of all of them
// together (compress.maxTrainingBytes).
const maxSampleFile = 256 << 20

// sampleAnswer reads one sample: a whole HTTP response when it starts
// with a status line, else a body. Headers a record never keeps
// (policy.ReservedHeader) are left out, the rest sorted by name: the
// order a proxy sends varies, the vocabulary does not.
func sampleAnswer(data []byte) (idem.Response, error) {
	if !bytes.HasPrefix(data, []byte("HTTP/")) {
		return idem.Response{Status: 200, Body: data}, nil
	}
	hr, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), nil)
	if err != nil {
		return idem.Response{}, fmt.Errorf("not an HTTP response: %w", err)
	}
	defer hr.Body.Close()
	body, err := io.ReadAll(hr.Body)
	if err != nil {
		return idem.Response{}, fmt.Errorf("reading the body: %w", err)
	}
	resp := idem.Response{Status: hr.StatusCode, Body: body}
	for name, values := range hr.Header {
		name = strings.ToLower(name)
		if policy.ReservedHeader(name) {
			continue
		}
		for _, v := range values {
			resp.Headers = append(resp.Headers, idem.Header{Name: name, Value: v})
		}
	}
	slices.SortStableFunc(resp.Headers, func(a, b idem.Header) int { return strings.Compare(a.Name, b.Name) })
	return resp, nil
}
