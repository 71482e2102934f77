package gofence

import (
	"crypto/sha256"
	"encoding/binary"
)

// AdvisoryLockKey is the advisory-lock key that fence.lock_key gives name,
// computed in Go: the key on which fence.try_lock, fence.unlock and
// fence.try_xact_lock take PostgreSQL's advisory lock for name, for a
// program that calls pg_advisory_lock and friends itself. It is the first 8
// bytes of sha256(name as UTF-8), big-endian, with the top bit set: always
// negative, so it never collides with golang-migrate's migration lock keys
// ([0, 2^32)) or with the keys of session leases ([2^62, 2^63)). Leases
// (Acquire) are rows of fence.leases, not advisory locks; only a session
// lease also holds one, keyed by its resource and token.
func AdvisoryLockKey(name string) int64 {
	sum := sha256.Sum256([]byte(name))
	return int64(binary.BigEndian.Uint64(sum[:8]) | 1<<63)
}
