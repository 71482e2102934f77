package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// NewBaseBackup takes a base backup of the running cluster with the WAL it
// needs (pg_basebackup -X stream; with the server-only binaries of the
// version matrix, a copy of the data directory taken between
// pg_backup_start and pg_backup_stop, then of pg_wal) into a new instance,
// and does not start it. The backup has no recovery.signal, standby.signal
// or primary_conninfo: StartBackup starts it as it is, the way a backup
// restored without recovery starts (crash recovery from its backup_label,
// on the backup's timeline; PostgreSQL then renames the label to
// backup_label.old). It is removed when the test ends.
func (c *Cluster) NewBaseBackup(t testing.TB) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	inst, err := pgcluster.New(c.inst.Bins)
	if err != nil {
		t.Fatalf("pgtest: new base backup: %v", err)
	}
	b := &Cluster{inst: inst}
	b.registerCleanup(t)
	if _, err := os.Stat(inst.Bins.Path("pg_basebackup")); err == nil {
		conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres", c.inst.Port)
		if _, err := inst.Run(ctx, "pg_basebackup", "-D", inst.Data, "-X", "stream", "-c", "fast", "-w", "-d", conninfo); err != nil {
			t.Fatalf("pgtest: new base backup: %v", err)
		}
	} else {
		t.Logf("pgtest: no pg_basebackup in %s: base backup copied between pg_backup_start and pg_backup_stop, with its WAL", inst.Bins.Dir)
		if err := copyBackupWithWAL(ctx, c.inst, inst); err != nil {
			t.Fatalf("pgtest: new base backup (copied): %v", err)
		}
	}
	if err := inst.AppendConf([]string{"unix_socket_directories = " + pgcluster.QuoteConf(inst.Base)}); err != nil {
		t.Fatalf("pgtest: new base backup: %v", err)
	}
	return b
}

// StartBackup starts a base backup made by NewBaseBackup, on a free port,
// and waits until it accepts writes.
func (c *Cluster) StartBackup(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), opTimeout)
	defer cancel()
	if err := c.inst.StartNewPort(ctx); err != nil {
		t.Fatalf("pgtest: start base backup: %v\nserver log:\n%s", err, c.inst.LogTail(30))
	}
	err := pgcluster.WaitReady(ctx, c.AdminURL(), func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		var inRecovery bool
		err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)
		return !inRecovery, err
	})
	if err != nil {
		t.Fatalf("pgtest: base backup still in recovery: %v", err)
	}
}

// copyBackupWithWAL is copyBaseBackup for a backup that starts on its own:
// no standby files, and the WAL from the backup's start to its end copied
// into the backup's pg_wal after pg_backup_stop (which switches to a new
// segment, so the segment holding the backup's end is complete). A
// temporary replication slot of the backup's session keeps the primary
// from recycling a segment in between.
func copyBackupWithWAL(ctx context.Context, src, dst *pgcluster.Instance) error {
	_, err := lowLevelBackup(ctx, src, dst, filepath.Base(dst.Base), true, nil, func(owner fileOwner) error {
		wal, err := os.ReadDir(filepath.Join(src.Data, "pg_wal"))
		if err != nil {
			return err
		}
		for _, e := range wal {
			if !e.Type().IsRegular() {
				continue
			}
			from, to := filepath.Join(src.Data, "pg_wal", e.Name()), filepath.Join(dst.Data, "pg_wal", e.Name())
			if err := copyFile(from, to, 0o600); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					continue // recycled: older than the backup's start
				}
				return err
			}
			if err := os.Lchown(to, owner.uid, owner.gid); err != nil {
				return err
			}
		}
		return nil
	})
	return err
}
