package cli

import (
	"strconv"
	"strings"
	"time"
)

// The exposition of pgfence status --format prometheus: Prometheus' text
// format (version 0.0.4), which node_exporter's textfile collector reads.
// Times are measured on the server's clock (the rows carry it), never on
// this machine's. Every family has HELP and TYPE lines; samples carry no
// timestamp (the textfile collector refuses them).

// leaseStates are the values of the state label, in the order printed.
var leaseStates = []string{"live", "expired", "released", "revoked", "free"}

const upHelp = "1 when pgfence status read fence.leases and fence.refusals; 0 when the read failed (then no other series)."

// promStatus is the exposition of r; perResource adds the series labelled
// by resource (one set per row of fence.leases).
func promStatus(r statusRead, perResource bool) string {
	var p promText
	p.family("pgfence_up", "gauge", upHelp)
	p.sample("pgfence_up", nil, "1")

	rows := statusRows(r.leases)
	count := map[string]int{}
	var minLeft, maxHeld float64
	anyTTL, anyLive := false, false
	held := make([]float64, len(rows))
	for i, row := range rows {
		count[leaseState(row)]++
		if !row.Live {
			continue
		}
		held[i] = r.leases[i].ServerNow.Sub(r.leases[i].AcquiredAt).Seconds()
		if !anyLive || held[i] > maxHeld {
			maxHeld = held[i]
		}
		anyLive = true
		if left := row.ExpiresInSeconds; left != nil {
			if !anyTTL || *left < minLeft {
				minLeft = *left
			}
			anyTTL = true
		}
	}
	p.family("pgfence_leases", "gauge", "Resources in fence.leases by state: live, expired (a TTL lease that ran out), released, revoked, free (a session lease whose session ended).")
	for _, s := range leaseStates {
		p.sample("pgfence_leases", []string{"state", s}, strconv.Itoa(count[s]))
	}
	if anyTTL {
		p.family("pgfence_lease_min_expires_in_seconds", "gauge", "The least time left of any live TTL lease, by the server's clock (absent when none is live).")
		p.sample("pgfence_lease_min_expires_in_seconds", nil, promFloat(minLeft))
	}
	if anyLive {
		p.family("pgfence_lease_max_held_seconds", "gauge", "The longest time since the grant of any live lease, by the server's clock (absent when none is live).")
		p.sample("pgfence_lease_max_held_seconds", nil, promFloat(maxHeld))
	}
	if len(r.refusals) > 0 {
		p.family("pgfence_write_refusals_total", "counter", "Tokens this database refused since the kit was installed (fence.refusals), by SQLSTATE: FN001 stale, FN002 none presented, FN003 never granted.")
		for _, f := range r.refusals {
			p.sample("pgfence_write_refusals_total", []string{"sqlstate", f.SQLState, "reason", f.Reason}, strconv.FormatInt(f.Count, 10))
		}
	}
	if b := r.budget; b != nil {
		p.family("pgfence_token_epoch", "gauge", "The epoch of the grants made now (fence.token_budget); each promotion and restore the kit sees moves it one up.")
		p.sample("pgfence_token_epoch", nil, strconv.FormatInt(b.Epoch, 10))
		p.family("pgfence_token_epochs_left", "gauge", "Later epochs the token layout has room for (2^20 - 1 - epoch).")
		p.sample("pgfence_token_epochs_left", nil, strconv.FormatInt(b.EpochsLeft, 10))
		p.family("pgfence_token_counter_moves_left", "gauge", "Crash restarts the shared token counter can still move 2^32 past, for the install's whole life (2047 on a fresh install).")
		p.sample("pgfence_token_counter_moves_left", nil, strconv.FormatInt(b.CounterMovesLeft, 10))
		p.family("pgfence_token_grants_left", "gauge", "Grants the shared token counter has room for, with no crash restart (a float: exact below 2^53).")
		p.sample("pgfence_token_grants_left", nil, strconv.FormatInt(b.GrantsLeft, 10))
	}
	if !perResource || len(rows) == 0 {
		return p.String()
	}

	p.family("pgfence_lease_info", "gauge", "One series per resource of fence.leases, always 1: its holder, kind (ttl, session, revoked) and state as labels.")
	for _, row := range rows {
		p.sample("pgfence_lease_info", []string{"resource", row.Resource, "holder", row.Holder, "kind", row.Kind, "state", leaseState(row)}, "1")
	}
	p.family("pgfence_lease_live", "gauge", "1 when the resource's lease is live now by the server's clock, else 0.")
	for _, row := range rows {
		live := "0"
		if row.Live {
			live = "1"
		}
		p.sample("pgfence_lease_live", []string{"resource", row.Resource}, live)
	}
	p.family("pgfence_lease_token", "gauge", "The latest token granted for the resource (a float: exact below 2^53, that is while the epoch is below 1024).")
	for _, row := range rows {
		p.sample("pgfence_lease_token", []string{"resource", row.Resource}, strconv.FormatInt(row.Token, 10))
	}
	if anyTTL {
		p.family("pgfence_lease_expires_in_seconds", "gauge", "Time left of the resource's live TTL lease, by the server's clock (fence.leases.expires_in).")
		for _, row := range rows {
			if row.ExpiresInSeconds != nil {
				p.sample("pgfence_lease_expires_in_seconds", []string{"resource", row.Resource}, promFloat(*row.ExpiresInSeconds))
			}
		}
	}
	if anyLive {
		p.family("pgfence_lease_held_seconds", "gauge", "Time since the grant of the resource's live lease, by the server's clock (renewals do not reset it).")
		for i, row := range rows {
			if row.Live {
				p.sample("pgfence_lease_held_seconds", []string{"resource", row.Resource}, promFloat(held[i]))
			}
		}
	}
	return p.String()
}

// promDown is the exposition of a failed read: pgfence_up 0 alone, so that
// the series of the last good read do not stand for the present.
func promDown() string {
	var p promText
	p.family("pgfence_up", "gauge", upHelp)
	p.sample("pgfence_up", nil, "0")
	return p.String()
}

// promText builds an exposition in the text format.
type promText struct{ b strings.Builder }

// family starts a metric family: its HELP and TYPE lines.
func (p *promText) family(name, typ, help string) {
	p.b.WriteString("# HELP " + name + " " + promHelpEscaper.Replace(help) + "\n")
	p.b.WriteString("# TYPE " + name + " " + typ + "\n")
}

// sample writes one sample; labels are name, value pairs.
func (p *promText) sample(name string, labels []string, value string) {
	p.b.WriteString(name)
	if len(labels) > 0 {
		p.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				p.b.WriteByte(',')
			}
			p.b.WriteString(labels[i] + `="` + promLabelEscaper.Replace(strings.ToValidUTF8(labels[i+1], "\uFFFD")) + `"`)
		}
		p.b.WriteByte('}')
	}
	p.b.WriteString(" " + value + "\n")
}

func (p *promText) String() string { return p.b.String() }

// The escapes of the text format: in HELP, backslash and line feed; in a
// label value, also the double quote.
var (
	promHelpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	promLabelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// promFloat formats seconds with millisecond precision (the server's clock
// gives microseconds; a scrape needs no more).
func promFloat(seconds float64) string {
	return strconv.FormatFloat(time.Duration(seconds*float64(time.Second)).Round(time.Millisecond).Seconds(), 'f', -1, 64)
}
