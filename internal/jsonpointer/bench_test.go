package jsonpointer

import (
	"strconv"
	"strings"
	"testing"
)

// BenchmarkFind reads a key and two match members from a tool call whose
// arguments carry a list of about n bytes, at the end of the body (the
// whole body is checked in any case).
func BenchmarkFind(b *testing.B) {
	ptrs := []Pointer{mustParse(b, "/method"), mustParse(b, "/params/name"), mustParse(b, "/params/arguments/client_order_id")}
	for _, n := range []struct {
		name string
		size int
	}{{"1KiB", 1 << 10}, {"64KiB", 64 << 10}, {"1MiB", 1 << 20}} {
		b.Run(n.name, func(b *testing.B) {
			var sb strings.Builder
			sb.WriteString(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_order","arguments":{"lines":[`)
			for i := 0; sb.Len() < n.size-60; i++ {
				if i > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(`{"sku":"sku-` + strconv.Itoa(i) + `","qty":` + strconv.Itoa(i%7+1) + `}`)
			}
			sb.WriteString(`],"client_order_id":"o-42"}}}`)
			body := []byte(sb.String())
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for range b.N {
				vs, err := Find(body, ptrs...)
				if err != nil || !vs[2].Found() {
					b.Fatal(err)
				}
			}
		})
	}
}
