// Package failover holds experiments, run as tests, that fail a Redis
// primary over in the middle of a stream of duplicate requests and count
// how many operations ran twice, with the default asynchronous
// reservations and with durability: replicated. See docs/redis.md for the
// figures and the command that reproduces them.
package failover
