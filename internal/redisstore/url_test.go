package redisstore

import (
	"strings"
	"testing"
	"time"
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
			_, o, _ := parseURL(raw)
			if o.MasterName != "mymaster" || o.DB != 0 || strings.Join(o.Addrs, " ") != "s1:26379 s2:26380 s3:26379" {
				t.Fatalf("options %+v", o)
			}
		}},
		{raw: "redis+sentinel://app:se%40cret@10.0.0.1:26379,[::1]:26379/main/3?sentinel_username=sen&sentinel_password=spw", top: Sentinel,
			want: func(t *testing.T, raw string) {
				_, o, _ := parseURL(raw)
				if o.Username != "app" || o.Password != "se@cret" || o.DB != 3 || o.MasterName != "main" ||
					o.SentinelUsername != "sen" || o.SentinelPassword != "spw" || o.Addrs[1] != "[::1]:26379" {
					t.Fatalf("options %+v", o)
				}
			}},
		{raw: "rediss+sentinel://s1/m", top: Sentinel, want: func(t *testing.T, raw string) {
			if _, o, _ := parseURL(raw); o.TLSConfig == nil {
				t.Fatal("rediss+sentinel without TLS")
			}
		}},
		{raw: "redis+cluster://n1:7000,n2:7001,n3", top: Cluster, want: func(t *testing.T, raw string) {
			_, o, _ := parseURL(raw)
			if !o.IsClusterMode || strings.Join(o.Addrs, " ") != "n1:7000 n2:7001 n3:6379" {
				t.Fatalf("options %+v", o)
			}
		}},
		{raw: "redis+cluster://n1:7000", top: Cluster, want: func(t *testing.T, raw string) {
			// One seed address is still a cluster.
			if _, o, _ := parseURL(raw); !o.IsClusterMode {
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

// TestSentinelAndClusterTakeTheStandaloneQueryOptions: the query options
// go-redis reads from a standalone URL work the same on the Sentinel and
// Cluster forms, parsed by go-redis's own ParseFailoverURL and
// ParseClusterURL; skip_verify too, where go-redis has it.
func TestSentinelAndClusterTakeTheStandaloneQueryOptions(t *testing.T) {
	const query = "pool_size=50&protocol=2&client_name=orders&dial_timeout=3&read_timeout=250ms&write_timeout=1s" +
		"&max_retries=4&min_idle_conns=2&max_idle_conns=8&max_active_conns=90&conn_max_idle_time=5m&pool_timeout=2s"
	for _, raw := range []string{
		"redis://r:6379/0?" + query,
		"redis+sentinel://s1:26379,s2/mymaster/1?sentinel_password=spw&" + query,
		"redis+cluster://n1:7000,n2:7001?" + query,
	} {
		_, o, err := parseURL(raw)
		if err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		if o.PoolSize != 50 || o.Protocol != 2 || o.ClientName != "orders" || o.DialTimeout != 3*time.Second ||
			o.ReadTimeout != 250*time.Millisecond || o.WriteTimeout != time.Second || o.MaxRetries != 4 || o.MinIdleConns != 2 ||
			o.MaxIdleConns != 8 || o.MaxActiveConns != 90 || o.ConnMaxIdleTime != 5*time.Minute || o.PoolTimeout != 2*time.Second {
			t.Errorf("%s: options %+v", raw, o)
		}
		if len(o.Addrs) != strings.Count(raw, ",")+1 {
			t.Errorf("%s: the query's parse changed the addresses: %v", raw, o.Addrs)
		}
	}
	_, o, err := parseURL("redis+sentinel://s1/m?sentinel_password=spw&sentinel_username=sen&pool_size=7")
	if err != nil || o.SentinelPassword != "spw" || o.SentinelUsername != "sen" || o.PoolSize != 7 {
		t.Fatalf("sentinel credentials beside options: %+v, %v", o, err)
	}
	_, o, err = parseURL("rediss+sentinel://s1/m?skip_verify=true")
	if err != nil || o.TLSConfig == nil || !o.TLSConfig.InsecureSkipVerify {
		t.Fatalf("rediss+sentinel skip_verify: %+v, %v", o, err)
	}
	if _, o, _ = parseURL("rediss+sentinel://s1/m"); o.TLSConfig.InsecureSkipVerify {
		t.Fatal("verification off without skip_verify")
	}
	// The client built from such a URL keeps the larger pool.
	rdb, err := NewClient("redis+cluster://n1:7000?pool_size=500", 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = rdb.Close()
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
		{"redis+sentinel://s1/m?password=x", `parameter "password": redis+sentinel takes it from the URL itself`},
		{"redis+sentinel://s1/m?master_name=other", `parameter "master_name"`},
		{"redis+cluster://n1:7000?addr=n2:7001", `parameter "addr"`},
		{"redis+sentinel://s1/m?route_by_latency=true", "read records from replicas"},
		{"redis+sentinel://s1/m?replica_only=true", "read records from replicas"},
		{"redis+cluster://n1:7000?nope=1", "unexpected option: nope"},
		{"redis+cluster://n1:7000?pool_size=many", "pool_size"},
		{"redis+cluster://n1:7000/1", "only database 0"},
		{"redis+cluster://n1:7000?read_only=true", "read records from replicas"},
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
		top, o, err := parseURL(raw)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "redis url:") {
				t.Fatalf("error %q lacks the prefix", err)
			}
			return
		}
		if top != Standalone && top != Sentinel && top != Cluster {
			t.Fatalf("topology %v", top)
		}
		if len(o.Addrs) == 0 || top == Standalone && len(o.Addrs) != 1 {
			t.Fatalf("%v with addresses %q", top, o.Addrs)
		}
		if (top == Sentinel) != (o.MasterName != "") {
			t.Fatalf("%v with master name %q", top, o.MasterName)
		}
		for _, a := range o.Addrs {
			if _, err := hostPort(a, "1"); err != nil {
				t.Fatalf("accepted address %q does not re-parse: %v", a, err)
			}
		}
	})
}
