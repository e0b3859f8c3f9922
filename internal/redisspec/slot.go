// Package redisspec holds what Redis itself defines and the server reads,
// one spelling each for the store, the test environments and the tools:
// Redis Cluster's key slot, the fields of INFO's text, and PING's answer.
package redisspec

import "strings"

// SlotCount is the number of Redis Cluster's slots.
const SlotCount = 16384

// Slot returns key's Redis Cluster slot: CRC16 (XMODEM: polynomial 0x1021,
// initial value 0) of the key, or of its hash tag, modulo SlotCount, as
// the Redis Cluster specification defines it (cluster-spec, "Key
// distribution model" and "Hash tags"). When the key holds a '{' followed, later, by a
// '}' with at least one byte between them, only the bytes between the
// first '{' and the first '}' after it are hashed.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % SlotCount
}
