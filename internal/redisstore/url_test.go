package redisstore

import (
	"strings"
	"testing"
)

func TestParseURLForms(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		top  Topology
		want func(t *testing.T, raw string)
	}{
		{raw: "redis://localhost:6379/0", top: Standalone},
		{raw: "rediss://user:pw@cache.example:6380/2", top: Standalone},
		{raw: "redis+sentinel://s1:26379,s2:26380,s3/mymaster", top: Sentinel, want: func(t *testing.T, raw string) {
			_, _, o, _ := parseURL(raw)
			if o.MasterName != "mymaster" || o.DB != 0 || strings.Join(o.Addrs, " ") != "s1:26379 s2:26380 s3:26379" {
				t.Fatalf("options %+v", o)
			}
		}},
		{raw: "redis+sentinel://app:se%40cret@10.0.0.1:26379,[::1]:26379/main/3?sentinel_username=sen&sentinel_password=spw", top: Sentinel,
			want: func(t *testing.T, raw string) {
				_, _, o, _ := parseURL(raw)
				if o.Username != "app" || o.Password != "se@cret" || o.DB != 3 || o.MasterName != "main" ||
					o.SentinelUsername != "sen" || o.SentinelPassword != "spw" || o.Addrs[1] != "[::1]:26379" {
					t.Fatalf("options %+v", o)
				}
			}},
		{raw: "rediss+sentinel://s1/m", top: Sentinel, want: func(t *testing.T, raw string) {
			if _, _, o, _ := parseURL(raw); o.TLSConfig == nil {
				t.Fatal("rediss+sentinel without TLS")
			}
		}},
		{raw: "redis+cluster://n1:7000,n2:7001,n3", top: Cluster, want: func(t *testing.T, raw string) {
			_, _, o, _ := parseURL(raw)
			if !o.IsClusterMode || strings.Join(o.Addrs, " ") != "n1:7000 n2:7001 n3:6379" {
				t.Fatalf("options %+v", o)
			}
		}},
		{raw: "redis+cluster://n1:7000", top: Cluster, want: func(t *testing.T, raw string) {
			// One seed address is still a cluster.
			if _, _, o, _ := parseURL(raw); !o.IsClusterMode {
				t.Fatal("not cluster mode")
			}
		}},
		{raw: "rediss+cluster://u:p@n1:7000/0", top: Cluster},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			top, err := ParseURL(tc.raw)
			if err != nil || top != tc.top {
				t.Fatalf("ParseURL = %v, %v; want %v", top, err, tc.top)
			}
			if tc.want != nil {
				tc.want(t, tc.raw)
			}
			rdb, err := NewClient(tc.raw, 0)
			if err != nil {
				t.Fatal(err)
			}
			_ = rdb.Close()
		})
	}
}

func TestParseURLErrorsNameTheProblem(t *testing.T) {
	for _, tc := range []struct{ raw, want string }{
		{"localhost:6379", "no scheme"},
		{"http://x", `scheme "http" is not one of`},
		{"redis://host:notaport", "redis url:"},
		{"redis://host:99999999/0", `port "99999999"`},
		{"rediss://user:pw@host:0", `port "0"`},
		{"redis+sentinel://s1:26379", "missing master name"},
		{"redis+sentinel://s1:26379/", "missing master name"},
		{"redis+sentinel:///m", "no address"},
		{"redis+sentinel://s1,,s2/m", "empty address"},
		{"redis+sentinel://s1:99999/m", `port "99999"`},
		{"redis+sentinel://s1:x/m", `port "x"`},
		{"redis+sentinel://s1/m/x", `database "x"`},
		{"redis+sentinel://s1/m/0/extra", "more than master and db"},
		{"redis+sentinel://s1/m?password=x", `unknown parameter "password"`},
		{"redis+cluster://n1:7000/1", "only database 0"},
		{"redis+cluster://n1:7000?read_only=true", `unknown parameter "read_only"`},
		{"redis+cluster://:7000", "has no host"},
		{"redis+cluster://n1#frag", "fragment"},
	} {
		t.Run(tc.raw, func(t *testing.T) {
			_, err := ParseURL(tc.raw)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.HasPrefix(err.Error(), "redis url: ") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to start with \"redis url: \" and mention %q", err, tc.want)
			}
			if _, err := NewClient(tc.raw, 0); err == nil {
				t.Fatal("NewClient accepted it")
			}
		})
	}
}

func TestParseURLNeverEchoesAPassword(t *testing.T) {
	for _, raw := range []string{
		"redis://u:hunter2@host:port/0",
		"redis://u:hunter2@host:6379/notadb",
		"redis+sentinel://u:hunter2@s1:x/m",
		"redis+cluster://u:hunter2@n1/5",
	} {
		if _, err := ParseURL(raw); err == nil || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL(%q) error %v", raw, err)
		}
	}
}

// FuzzParseURL holds the URL parser (the store's part of the
// configuration) to: no panic; an accepted URL yields a usable client
// configuration with at least one host:port address; a rejected one says
// "redis url:" and never repeats the password.
func FuzzParseURL(f *testing.F) {
	for _, s := range []string{
		"redis://localhost:6379/0", "rediss://u:p@h:1/2?pool_size=3",
		"redis+sentinel://u:p@s1:26379,s2/mymaster/1?sentinel_password=x",
		"redis+cluster://n1:7000,[::1]:7001", "redis+cluster://n1/0", "redis+sentinel://,/", "x://",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		top, simple, multi, err := parseURL(raw)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "redis url:") {
				t.Fatalf("error %q lacks the prefix", err)
			}
			return
		}
		switch top {
		case Standalone:
			if simple == nil || simple.Addr == "" {
				t.Fatalf("standalone without an address: %+v", simple)
			}
		case Sentinel, Cluster:
			if multi == nil || len(multi.Addrs) == 0 {
				t.Fatalf("%v without addresses", top)
			}
			if top == Sentinel && multi.MasterName == "" {
				t.Fatal("sentinel without a master name")
			}
			for _, a := range multi.Addrs {
				if _, err := hostPort(a, "1"); err != nil {
					t.Fatalf("accepted address %q does not re-parse: %v", a, err)
				}
			}
		default:
			t.Fatalf("topology %v", top)
		}
	})
}
