package gofence

import "time"

// SetTrustDeadline moves l's trust deadline and its loss timer to d, as a
// successful renewal does; tests use it to stand in for a renewal that
// succeeded on another path while one of theirs is held up.
func (l *Lease) SetTrustDeadline(d time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.deadline = d
	l.lossTimer.Reset(time.Until(d))
}
