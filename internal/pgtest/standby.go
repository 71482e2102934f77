package pgtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/jackc/pgx/v5"

	"github.com/pgfence/pgfence/internal/pgcluster"
)

// copyBaseBackup makes dst (a new, empty instance) a streaming standby of
// the running primary src without pg_basebackup, which the server-only
// binaries of the version matrix do not ship (and whose version must match
// the server's: pg_basebackup 15 writes an sslsni option into
// primary_conninfo that a 13 standby rejects). It is the documented
// low-level base backup: a non-exclusive backup started and stopped in one
// session, a file copy of the data directory in between, the backup label
// written into the copy, and a physical replication slot created first so
// that the primary keeps every WAL segment the standby will stream from the
// backup's start.
func copyBaseBackup(ctx context.Context, src, dst *pgcluster.Instance, appName string) error {
	slot, err := lowLevelBackup(ctx, src, dst, appName, false, map[string]string{"standby.signal": ""}, nil)
	if err != nil {
		return err
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", src.Port, appName)
	return dst.AppendConf([]string{
		"primary_conninfo = " + pgcluster.QuoteConf(conninfo),
		"primary_slot_name = " + pgcluster.QuoteConf(slot),
	})
}

// lowLevelBackup copies src's data directory into dst between
// pg_backup_start and pg_backup_stop (pg_start_backup / pg_stop_backup
// before 15) in one session, after creating a physical replication slot
// (temporary: dropped when the session ends, else kept for a standby to
// stream from), and writes the backup label, the tablespace map and extra
// files into the copy. after, if not nil, runs before the session ends
// (while a temporary slot still holds the WAL). It returns the slot's name.
func lowLevelBackup(ctx context.Context, src, dst *pgcluster.Instance, label string, temporary bool, extra map[string]string, after func(fileOwner) error) (string, error) {
	conn, err := pgx.Connect(ctx, src.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	var version int
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return "", err
	}
	slot := pgcluster.ScratchName("pgtest_", 6)
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true, $2)", slot, temporary); err != nil {
		return "", fmt.Errorf("create replication slot: %w", err)
	}
	start, stop := "SELECT pg_backup_start($1, true)", "SELECT labelfile, spcmapfile FROM pg_backup_stop(false)"
	if version < 150000 {
		start, stop = "SELECT pg_start_backup($1, true, false)", "SELECT labelfile, spcmapfile FROM pg_stop_backup(false, false)"
	}
	if _, err := conn.Exec(ctx, start, label); err != nil {
		return "", fmt.Errorf("start backup: %w", err)
	}
	if err := copyDataDir(src.Data, dst.Data); err != nil {
		return "", err
	}
	var labelFile, spcmap string
	if err := conn.QueryRow(ctx, stop).Scan(&labelFile, &spcmap); err != nil {
		return "", fmt.Errorf("stop backup: %w", err)
	}
	owner, err := ownerOf(src.Data)
	if err != nil {
		return "", err
	}
	files := map[string]string{"backup_label": labelFile}
	if spcmap != "" {
		files["tablespace_map"] = spcmap
	}
	for name, content := range extra {
		files[name] = content
	}
	for name, content := range files {
		p := filepath.Join(dst.Data, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return "", err
		}
		if err := os.Lchown(p, owner.uid, owner.gid); err != nil {
			return "", err
		}
	}
	if after != nil {
		if err := after(owner); err != nil {
			return "", err
		}
	}
	return slot, nil
}

type fileOwner struct{ uid, gid int }

func ownerOf(path string) (fileOwner, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileOwner{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileOwner{}, errors.New("pgtest: cannot read file owners on this platform")
	}
	return fileOwner{uid: int(st.Uid), gid: int(st.Gid)}, nil
}

// copyDataDir copies a running server's data directory the way
// pg_basebackup does: without the WAL (the standby streams it), replication
// slots, the postmaster's pid and options files and temporary statistics;
// files that vanish during the copy are skipped (WAL replay from the backup's
// start makes the copy consistent). Ownership and modes are kept, so that
// the server's OS user owns the copy.
func copyDataDir(src, dst string) error {
	skipContents := map[string]bool{"pg_wal": true, "pg_replslot": true, "pg_stat_tmp": true, "pg_dynshmem": true, "pg_notify": true, "pg_serial": true, "pg_snapshots": true, "pg_subtrans": true}
	skipFiles := map[string]bool{"postmaster.pid": true, "postmaster.opts": true, "backup_label.old": true}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if skipFiles[rel] {
			return nil
		}
		if parent := filepath.Dir(rel); skipContents[parent] && !(parent == "pg_wal" && d.IsDir() && d.Name() == "archive_status") {
			return skipDir(d)
		}
		if parent := filepath.Dir(filepath.Dir(rel)); parent == "pg_wal" {
			return skipDir(d) // pg_wal/archive_status/*
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		owner, err := ownerOf(path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			if err := os.MkdirAll(target, fi.Mode().Perm()); err != nil {
				return err
			}
		case fi.Mode().Type() == fs.ModeSymlink:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case fi.Mode().IsRegular():
			if err := copyFile(path, target, fi.Mode().Perm()); err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				return err
			}
		default:
			return nil
		}
		return os.Lchown(target, owner.uid, owner.gid)
	})
}

func skipDir(d fs.DirEntry) error {
	if d.IsDir() {
		return fs.SkipDir
	}
	return nil
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
