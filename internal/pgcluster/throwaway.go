package pgcluster

import (
	"context"
	"fmt"
)

// LocalBins finds the server binaries as FindBins does and checks that they
// can be run (CheckCredential): the two conditions for starting a cluster
// on this machine.
func LocalBins(override string) (Bins, error) {
	bins, err := FindBins(override)
	if err != nil {
		return Bins{}, err
	}
	if err := CheckCredential(); err != nil {
		return Bins{}, err
	}
	return bins, nil
}

// StartThrowaway creates a cluster from bins (New), runs initdb with the
// conf lines appended to postgresql.conf (Initdb) and starts it on a free
// port (StartNewPort), all bounded by Timeout. The caller removes it with
// Destroy (or keeps it with Preserve). On failure nothing is left behind,
// and an error of the start carries the tail of the server log.
func StartThrowaway(ctx context.Context, bins Bins, conf []string) (*Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	inst, err := New(bins)
	if err != nil {
		return nil, err
	}
	if err := inst.Initdb(ctx, conf); err != nil {
		inst.Destroy()
		return nil, err
	}
	if err := inst.StartNewPort(ctx); err != nil {
		err = fmt.Errorf("%w\nserver log:\n%s", err, inst.LogTail(30))
		inst.Destroy()
		return nil, err
	}
	return inst, nil
}
