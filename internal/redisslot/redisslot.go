// Package redisslot is Redis Cluster's key slot, the one spelling of it
// for the store and the test environments: CRC16 (XMODEM: polynomial
// 0x1021, initial value 0) of the key, or of its hash tag, modulo 16384,
// as the Redis Cluster specification defines it (cluster-spec, "Key
// distribution model" and "Hash tags").
package redisslot

import "strings"

// Count is the number of slots.
const Count = 16384

// Of returns key's slot. When the key holds a '{' followed, later, by a
// '}' with at least one byte between them, only the bytes between the
// first '{' and the first '}' after it are hashed.
func Of(key string) int {
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
	return int(crc) % Count
}
