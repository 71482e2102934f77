/*
 * cguard.c: a measurement prototype of pgfence's guards in C (issue 20).
 * NOT shipped, NOT installed by any migration: the kit is plain SQL. It
 * does what the PL/pgSQL guards' READ COMMITTED fast path does, with the
 * same gate and the same lease lookup, so that the instruction counts show
 * what a C guard would cost:
 *   cguard_tw(resource, token_column)      table-wide row trigger
 *   cguard_rows(resource_column, prefix, token_column)  per-row row trigger
 *   cguard_use_token(resource, token)      fence.use_token's check + setting
 * Token: an assigned token column (INSERT, or UPDATE whose SET list names
 * it: tg_updatedcols, which PL/pgSQL cannot see), else fence.tokens.
 * Gate: the kit's shared advisory gate key, taken under the transaction's
 * resource owner (no subtransaction needed); per-row past 64 gates a KEY
 * SHARE row lock of the lease row instead. Lease: an index scan of
 * fence.lease_pkey with a fresh snapshot. Role: current_user must be the
 * acting role, and must have SELECT on fence.lease. Anything else, and
 * every refusal, is an ERROR here (the kit's slow path is not prototyped).
 */
#include "postgres.h"
#include "fmgr.h"
#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_collation.h"
#include "commands/trigger.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "nodes/bitmapset.h"
#include "storage/lock.h"
#include "storage/proc.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"

PG_MODULE_MAGIC;

static Oid	lease_rel = InvalidOid;
static Oid	lease_idx = InvalidOid;
static LocalTransactionId gates_lxid = InvalidLocalTransactionId;
static int	gates = 0;

static void
init_oids(void)
{
	if (!OidIsValid(lease_rel))
	{
		Oid			ns = get_namespace_oid("fence", false);

		lease_rel = get_relname_relid("lease", ns);
		lease_idx = get_relname_relid("lease_pkey", ns);
	}
}

/* the kit's fence._gate_key: hashtextextended(resource, 0) & (2^61-1) | 2^61 */
static bool
take_gate(text *res)
{
	uint64		k;
	LOCKTAG		tag;
	ResourceOwner save = CurrentResourceOwner;
	LockAcquireResult r;

	k = DatumGetUInt64(hash_any_extended((unsigned char *) VARDATA_ANY(res), VARSIZE_ANY_EXHDR(res), 0));
	k = (k & UINT64CONST(2305843009213693951)) | UINT64CONST(2305843009213693952);
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, (uint32) (k >> 32), (uint32) k, 1);
	CurrentResourceOwner = TopTransactionResourceOwner;
	r = LockAcquire(&tag, ShareLock, false, true);
	CurrentResourceOwner = save;
	return r != LOCKACQUIRE_NOT_AVAIL;
}

/* the latest token of res, optionally KEY SHARE locking its row; false if none */
static bool
lease_token(text *res, int64 *token, bool lock)
{
	Relation	rel,
				idx;
	ScanKeyData key;
	Snapshot	snap;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found;

	init_oids();
	if (pg_class_aclcheck(lease_rel, GetUserId(), ACL_SELECT) != ACLCHECK_OK)
		ereport(ERROR, (errcode(ERRCODE_INSUFFICIENT_PRIVILEGE), errmsg("cguard: no usage of the kit")));
	rel = table_open(lease_rel, lock ? RowShareLock : AccessShareLock);
	idx = index_open(lease_idx, AccessShareLock);
	ScanKeyEntryInitialize(&key, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   idx->rd_indcollation[0], F_TEXTEQ, PointerGetDatum(res));
	snap = RegisterSnapshot(GetLatestSnapshot());
	scan = index_beginscan(rel, idx, snap, 1, 0);
	index_rescan(scan, &key, 1, NULL, 0);
	slot = table_slot_create(rel, NULL);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
	{
		bool		isnull;

		*token = DatumGetInt64(slot_getattr(slot, 2, &isnull));
		if (lock)
		{
			TM_FailureData tmfd;

			if (table_tuple_lock(rel, &slot->tts_tid, snap, slot, GetCurrentCommandId(false),
								 LockTupleKeyShare, LockWaitBlock, 0, &tmfd) != TM_Ok)
				elog(ERROR, "cguard: the lease row changed (slow path not prototyped)");
		}
	}
	ExecDropSingleTupleTableSlot(slot);
	index_endscan(scan);
	UnregisterSnapshot(snap);
	index_close(idx, AccessShareLock);
	table_close(rel, NoLock);
	return found;
}

static void
check(text *res, int64 tok, bool have, bool per_row)
{
	int64		latest;
	bool		lock = false;

	if (!have)
		ereport(ERROR, (errcode(ERRCODE_RAISE_EXCEPTION), errmsg("cguard: no token presented for %s", text_to_cstring(res))));
	if (GetUserId() != GetOuterUserId())
		elog(ERROR, "cguard: write on behalf of another role (slow path not prototyped)");
	if (XactIsoLevel != XACT_READ_COMMITTED)
		elog(ERROR, "cguard: snapshot isolation (slow path not prototyped)");
	if (per_row)
	{
		if (gates_lxid != MyProc->lxid)
		{
			gates_lxid = MyProc->lxid;
			gates = 0;
		}
		lock = ++gates > 64;
	}
	if (!lock && !take_gate(res))
		elog(ERROR, "cguard: gate busy (slow path not prototyped)");
	if (!lease_token(res, &latest, lock) || latest != tok)
		ereport(ERROR, (errcode(ERRCODE_RAISE_EXCEPTION),
						errmsg("cguard: stale or unknown token " INT64_FORMAT " for %s", tok, text_to_cstring(res))));
}

/* fence.tokens' entry for res */
static bool
setting_token(text *res, int64 *tok)
{
	const char *s = GetConfigOption("fence.tokens", true, false);
	Jsonb	   *jb;
	JsonbValue	k,
			   *v;

	if (s == NULL || s[0] == '\0')
		return false;
	jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(s)));
	k.type = jbvString;
	k.val.string.val = VARDATA_ANY(res);
	k.val.string.len = VARSIZE_ANY_EXHDR(res);
	v = findJsonbValueFromContainer(&jb->root, JB_FOBJECT, &k);
	if (v == NULL)
		return false;
	if (v->type == jbvNumeric)
		*tok = DatumGetInt64(DirectFunctionCall1(numeric_int8, NumericGetDatum(v->val.numeric)));
	else if (v->type == jbvString)
		*tok = pg_strtoint64(pnstrdup(v->val.string.val, v->val.string.len));
	else
		return false;
	return true;
}

/* the token a row presents: an assigned token column, else fence.tokens */
static bool
row_token(TriggerData *td, int tcol, text *res, int64 *tok)
{
	TupleDesc	desc = td->tg_relation->rd_att;
	bool		isnull;

	if (tcol > 0 && !TRIGGER_FIRED_BY_DELETE(td->tg_event) &&
		(TRIGGER_FIRED_BY_INSERT(td->tg_event) ||
		 bms_is_member(tcol - FirstLowInvalidHeapAttributeNumber, td->tg_updatedcols)))
	{
		Datum		d = heap_getattr(td->tg_newtuple ? td->tg_newtuple : td->tg_trigtuple, tcol, desc, &isnull);

		if (!isnull)
		{
			*tok = DatumGetInt64(d);
			return true;
		}
	}
	return setting_token(res, tok);
}

static HeapTuple
result(TriggerData *td)
{
	if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
		return td->tg_newtuple;
	return td->tg_trigtuple;
}

PG_FUNCTION_INFO_V1(cguard_tw);
Datum
cguard_tw(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	text	   *res;
	int			tcol = 0;
	int64		tok = 0;
	bool		have;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BEFORE(td->tg_event))
		elog(ERROR, "cguard_tw: a BEFORE ROW trigger");
	res = cstring_to_text(td->tg_trigger->tgargs[0]);
	if (td->tg_trigger->tgnargs > 1)
		tcol = SPI_fnumber(td->tg_relation->rd_att, td->tg_trigger->tgargs[1]);
	have = row_token(td, tcol, res, &tok);
	check(res, tok, have, false);
	if (tcol > 0 && TRIGGER_FIRED_BY_UPDATE(td->tg_event))
	{
		bool		isnull;
		Datum		old = heap_getattr(td->tg_trigtuple, tcol, td->tg_relation->rd_att, &isnull);

		if (!isnull && DatumGetInt64(old) > tok)
			elog(ERROR, "cguard: the row already carries a newer token");
	}
	return PointerGetDatum(result(td));
}

static text *
row_resource(TriggerData *td, HeapTuple tup, int rcol, const char *prefix)
{
	char	   *v = SPI_getvalue(tup, td->tg_relation->rd_att, rcol);

	if (v == NULL)
		elog(ERROR, "cguard: a row without resource");
	return cstring_to_text(psprintf("%s%s", prefix, v));
}

PG_FUNCTION_INFO_V1(cguard_rows);
Datum
cguard_rows(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;
	TupleDesc	desc;
	int			rcol,
				tcol = 0;
	const char *prefix;
	text	   *res;
	int64		tok = 0;
	bool		have;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_FOR_ROW(td->tg_event) || !TRIGGER_FIRED_BEFORE(td->tg_event))
		elog(ERROR, "cguard_rows: a BEFORE ROW trigger");
	desc = td->tg_relation->rd_att;
	rcol = SPI_fnumber(desc, td->tg_trigger->tgargs[0]);
	prefix = td->tg_trigger->tgargs[1];
	if (td->tg_trigger->tgnargs > 2)
		tcol = SPI_fnumber(desc, td->tg_trigger->tgargs[2]);
	/* the row as it will be (or the deleted row) */
	res = row_resource(td, result(td), rcol, prefix);
	have = row_token(td, tcol, res, &tok);
	check(res, tok, have, true);
	if (TRIGGER_FIRED_BY_UPDATE(td->tg_event))
	{
		text	   *old = row_resource(td, td->tg_trigtuple, rcol, prefix);
		bool		isnull;
		Datum		ot;

		if (!DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID, PointerGetDatum(old), PointerGetDatum(res))))
		{
			int64		otok = 0;

			/* moved out of another resource: that one's token too */
			if (!setting_token(old, &otok))
				elog(ERROR, "cguard: no token for the resource the row leaves");
			check(old, otok, true, true);
		}
		else if (tcol > 0)
		{
			ot = heap_getattr(td->tg_trigtuple, tcol, desc, &isnull);
			if (!isnull && DatumGetInt64(ot) > tok)
				elog(ERROR, "cguard: the row already carries a newer token");
		}
	}
	return PointerGetDatum(result(td));
}

PG_FUNCTION_INFO_V1(cguard_use_token);
Datum
cguard_use_token(PG_FUNCTION_ARGS)
{
	text	   *res = PG_GETARG_TEXT_PP(0);
	int64		tok = PG_GETARG_INT64(1);
	const char *s;
	char	   *r = text_to_cstring(res);
	char	   *nv;

	check(res, tok, true, false);
	/* fence.tokens := fence.tokens || {res: tok} (a prototype: appends to a one-entry object) */
	s = GetConfigOption("fence.tokens", true, false);
	if (s == NULL || s[0] == '\0' || strcmp(s, "{}") == 0)
		nv = psprintf("{\"%s\": " INT64_FORMAT "}", r, tok);
	else
		nv = psprintf("{\"%s\": " INT64_FORMAT ", %s", r, tok, s + 1);
	(void) set_config_option("fence.tokens", nv, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
	PG_RETURN_VOID();
}
