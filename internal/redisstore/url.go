package redisstore

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/idem-extproc/idem-extproc/internal/idem"
)

// Topology names how Redis is deployed.
type Topology uint8

const (
	// Standalone is one Redis server (redis://, rediss://).
	Standalone Topology = iota + 1
	// Sentinel is a primary with replicas watched by Redis Sentinel
	// (redis+sentinel://, rediss+sentinel://).
	Sentinel
	// Cluster is Redis Cluster (redis+cluster://, rediss+cluster://).
	Cluster
)

func (t Topology) String() string {
	return idem.EnumName(t, "invalid", "standalone", "sentinel", "cluster")
}

// URLForms lists the accepted URL forms, for error messages and help.
const URLForms = "redis://[user:pass@]host:port[/db], rediss://…, " +
	"redis+sentinel://[user:pass@]host:port[,host:port…]/master[/db][?sentinel_username=…&sentinel_password=…], rediss+sentinel://…, " +
	"redis+cluster://[user:pass@]host:port[,host:port…], rediss+cluster://… " +
	"(each takes go-redis's query options, e.g. ?pool_size=50&protocol=2)"

// Default ports when a Sentinel or Cluster address omits one.
const (
	defaultSentinelPort = "26379"
	defaultRedisPort    = "6379"
)

// ParseURL checks a Redis URL of any accepted form (see URLForms) and
// reports its topology. Every error starts with "redis url:" and names the
// problem; none repeats a password.
func ParseURL(raw string) (Topology, error) {
	top, _, err := parseURL(raw)
	return top, err
}

// parseURL reads a URL into the options of one go-redis client, whatever
// its topology. Standalone URLs are go-redis's own (redis.ParseURL, its
// query options included), copied into UniversalOptions with one address,
// from which go-redis's NewUniversalClient makes a single-node client
// (universal.go NewUniversalClient, UniversalOptions.Simple). The Sentinel
// and Cluster forms are this package's, because go-redis's
// ParseFailoverURL and ParseClusterURL share the redis:// scheme with a
// standalone URL and cannot be told apart from one.
func parseURL(raw string) (Topology, *redis.UniversalOptions, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return 0, nil, fmt.Errorf("redis url: no scheme; want one of %s", URLForms)
	}
	switch scheme {
	case "redis", "rediss":
		o, err := redis.ParseURL(raw)
		if err != nil {
			return 0, nil, fmt.Errorf("redis url: %w", redactErr(err, raw))
		}
		// go-redis leaves the address to the dialer, which would refuse a
		// port out of range only at the first call, long after start.
		if _, err := hostPort(o.Addr, defaultRedisPort); err != nil {
			return 0, nil, err
		}
		u := &redis.UniversalOptions{Addrs: []string{o.Addr}, TLSConfig: o.TLSConfig}
		return Standalone, u, copyOptions(u, o)
	case "redis+sentinel", "rediss+sentinel":
		return parseMulti(Sentinel, scheme, rest)
	case "redis+cluster", "rediss+cluster":
		return parseMulti(Cluster, scheme, rest)
	}
	return 0, nil, fmt.Errorf("redis url: scheme %q is not one of redis, rediss, redis+sentinel, rediss+sentinel, redis+cluster, rediss+cluster; want one of %s", scheme, URLForms)
}

// redactErr drops a URL's password from a go-redis error, which may quote
// the URL it could not parse. The password is found by hand: the URL may
// be too broken for net/url.
func redactErr(err error, raw string) error {
	_, rest, _ := strings.Cut(raw, "://")
	authority, _, _ := strings.Cut(rest, "/")
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		return err
	}
	_, pass, ok := strings.Cut(authority[:at], ":")
	if !ok || pass == "" {
		return err
	}
	msg := strings.ReplaceAll(err.Error(), pass, "xxxxx")
	if u, uerr := url.PathUnescape(pass); uerr == nil && u != "" {
		msg = strings.ReplaceAll(msg, u, "xxxxx")
	}
	return errors.New(msg)
}

// parseMulti reads the Sentinel and Cluster forms: a comma-separated list
// of addresses, credentials for the data nodes in the user info, and for
// Sentinel the master name and database in the path and the Sentinels' own
// credentials in the query.
func parseMulti(top Topology, scheme, rest string) (Topology, *redis.UniversalOptions, error) {
	form := "redis+cluster://[user:pass@]host:port[,host:port…]"
	defPort := defaultRedisPort
	if top == Sentinel {
		form = "redis+sentinel://[user:pass@]host:port[,host:port…]/master[/db]"
		defPort = defaultSentinelPort
	}
	rest, fragment, _ := strings.Cut(rest, "#")
	if fragment != "" {
		return 0, nil, fmt.Errorf("redis url: unexpected fragment #%s; want %s", fragment, form)
	}
	rest, rawQuery, _ := strings.Cut(rest, "?")
	authority, path, _ := strings.Cut(rest, "/")
	o := &redis.UniversalOptions{}
	if err := parseMultiAuthority(o, authority, form, defPort); err != nil {
		return 0, nil, err
	}
	if err := parseMultiPath(o, top, path, form); err != nil {
		return 0, nil, err
	}

	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return 0, nil, fmt.Errorf("redis url: bad query: %v", err)
	}
	if top == Sentinel {
		o.SentinelUsername = q.Get("sentinel_username")
		o.SentinelPassword = q.Get("sentinel_password")
		q.Del("sentinel_username")
		q.Del("sentinel_password")
	}
	skipVerify, err := applyQueryOptions(o, top, scheme, q)
	if err != nil {
		return 0, nil, err
	}
	if strings.HasPrefix(scheme, "rediss") {
		// No ServerName: crypto/tls takes it from each address dialled, and
		// a Sentinel's or Cluster's nodes each have their own.
		// InsecureSkipVerify only when the URL says skip_verify=true, as
		// go-redis's own parsers do.
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: skipVerify}
	}
	return top, o, nil
}

// parseMultiAuthority sets o's credentials from the authority's user info
// and o.Addrs from its comma-separated addresses, defPort where one has
// no port; form is the URL's expected shape, for the errors.
func parseMultiAuthority(o *redis.UniversalOptions, authority, form, defPort string) error {
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		user, pass, hasPass := strings.Cut(authority[:at], ":")
		var err error
		if o.Username, err = url.PathUnescape(user); err != nil {
			return fmt.Errorf("redis url: bad escape in the user name")
		}
		if hasPass {
			if o.Password, err = url.PathUnescape(pass); err != nil {
				return fmt.Errorf("redis url: bad escape in the password")
			}
		}
		authority = authority[at+1:]
	}
	if authority == "" {
		return fmt.Errorf("redis url: no address; want %s", form)
	}
	for _, a := range strings.Split(authority, ",") {
		addr, err := hostPort(a, defPort)
		if err != nil {
			return err
		}
		o.Addrs = append(o.Addrs, addr)
	}
	return nil
}

// parseMultiPath reads the path after the addresses: for Sentinel the
// master name and an optional database, for Cluster nothing but database
// 0, the only one Redis Cluster has.
func parseMultiPath(o *redis.UniversalOptions, top Topology, path, form string) error {
	segs := strings.Split(strings.TrimSuffix(path, "/"), "/")
	if path == "" {
		segs = nil
	}
	switch top {
	case Sentinel:
		if len(segs) == 0 || segs[0] == "" {
			return fmt.Errorf("redis url: missing master name; want %s", form)
		}
		name, err := url.PathUnescape(segs[0])
		if err != nil {
			return fmt.Errorf("redis url: bad escape in the master name %q", segs[0])
		}
		o.MasterName = name
		if len(segs) > 2 {
			return fmt.Errorf("redis url: path /%s has more than master and db; want %s", path, form)
		}
		if len(segs) == 2 {
			db, err := strconv.Atoi(segs[1])
			if err != nil || db < 0 {
				return fmt.Errorf("redis url: database %q is not a non-negative number", segs[1])
			}
			o.DB = db
		}
	case Cluster:
		o.IsClusterMode = true
		if len(segs) > 1 || (len(segs) == 1 && segs[0] != "0") {
			return fmt.Errorf("redis url: Redis Cluster has only database 0, the path /%s selects another; want %s", path, form)
		}
	}
	return nil
}

// notFromQuery are go-redis query options this package's Sentinel and
// Cluster forms take from elsewhere in the URL (addresses, credentials,
// master name, database), so that no setting has two sources.
var notFromQuery = []string{"addr", "username", "password", "master_name", "db"}

// replicaReads are go-redis options that send reads to replicas (or, for
// Sentinel, that go-redis's failover client refuses with a panic). The
// store reads a record to decide on it right after a write to the primary;
// a lagging replica would answer from before the write, so they are
// refused rather than honoured.
var replicaReads = []string{"read_only", "replica_only", "use_disconnected_replicas", "route_by_latency", "route_randomly"}

// applyQueryOptions gives the Sentinel and Cluster forms the query options
// of a standalone URL (pool_size, dial_timeout, protocol, client_name, …):
// go-redis parses them itself, with redis.ParseFailoverURL and
// redis.ParseClusterURL (sentinel.go setupFailoverConnParams, osscluster.go
// setupClusterQueryParams: snake_case field names, durations with a unit or
// in seconds, unknown names refused), and the fields it set are copied into
// o by name. It returns skip_verify, which go-redis applies to its own TLS
// configuration.
func applyQueryOptions(o *redis.UniversalOptions, top Topology, scheme string, q url.Values) (bool, error) {
	for name := range q {
		if slices.Contains(notFromQuery, name) {
			return false, fmt.Errorf("redis url: parameter %q: %s takes it from the URL itself (%s)", name, scheme, URLForms)
		}
		if slices.Contains(replicaReads, name) {
			return false, fmt.Errorf("redis url: parameter %q would read records from replicas, which may not have the latest write yet; the store reads from primaries only", name)
		}
	}
	if len(q) == 0 {
		return false, nil
	}
	// Any address: go-redis only needs one to parse the query; TLS on
	// when the URL's is, for skip_verify.
	base := "redis"
	if strings.HasPrefix(scheme, "rediss") {
		base = "rediss"
	}
	probe := base + "://query.invalid:1/?" + q.Encode()
	var parsed any
	var err error
	if top == Sentinel {
		parsed, err = redis.ParseFailoverURL(probe)
	} else {
		parsed, err = redis.ParseClusterURL(probe)
	}
	if err != nil {
		return false, fmt.Errorf("redis url: %s: %w", scheme, err)
	}
	skip := false
	switch p := parsed.(type) {
	case *redis.FailoverOptions:
		skip = p.TLSConfig != nil && p.TLSConfig.InsecureSkipVerify
	case *redis.ClusterOptions:
		skip = p.TLSConfig != nil && p.TLSConfig.InsecureSkipVerify
	}
	return skip, copyOptions(o, parsed)
}

// copyOptions copies every field go-redis set from a URL (non-zero) into
// the field of the same name and type of o; one o lacks is refused. The
// addresses and TLS configuration are the caller's to set, and Network is
// always tcp for the redis and rediss schemes, go-redis's default for a
// host:port address (options.go setupTCPConn, Options.init).
func copyOptions(o *redis.UniversalOptions, parsed any) error {
	src := reflect.ValueOf(parsed).Elem()
	dst := reflect.ValueOf(o).Elem()
	for i := 0; i < src.NumField(); i++ {
		f := src.Type().Field(i)
		v := src.Field(i)
		if !f.IsExported() || v.IsZero() || slices.Contains([]string{"SentinelAddrs", "Addrs", "Addr", "Network", "TLSConfig"}, f.Name) {
			continue
		}
		d := dst.FieldByName(f.Name)
		if !d.IsValid() || d.Type() != f.Type || !d.CanSet() {
			return fmt.Errorf("redis url: option %s is not supported with this topology", f.Name)
		}
		d.Set(v)
	}
	return nil
}

// hostPort checks one host[:port] of an address list.
func hostPort(a, defPort string) (string, error) {
	if a == "" {
		return "", errors.New("redis url: empty address in the list (two commas, or a trailing one)")
	}
	host, port := a, defPort
	if strings.HasPrefix(a, "[") || strings.Count(a, ":") == 1 {
		var err error
		if host, port, err = net.SplitHostPort(a); err != nil {
			if !strings.Contains(err.Error(), "missing port") {
				return "", fmt.Errorf("redis url: address %q: %v", a, err)
			}
			host, port = strings.Trim(a, "[]"), defPort
		}
	}
	if host == "" {
		return "", fmt.Errorf("redis url: address %q has no host", a)
	}
	if strings.Contains(host, ":") {
		if net.ParseIP(host) == nil {
			return "", fmt.Errorf("redis url: address %q: %q is not an IPv6 address", a, host)
		}
	} else if strings.IndexFunc(host, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == '_')
	}) >= 0 {
		return "", fmt.Errorf("redis url: address %q: %q is not a host name or IP address", a, host)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("redis url: address %q: port %q is not a number from 1 to 65535", a, port)
	}
	return net.JoinHostPort(host, port), nil
}
