/* SPDX-License-Identifier: MIT */
/*
 * tier.c - the engine's side of tier.h: the registered tables, the typed
 * wait, and the wrappers (engine_internal.h, "tiers below") through which
 * the engine calls a tier without naming it.
 */
#include <errno.h>
#include <inttypes.h>

#include "engine_internal.h"

static const struct tier_ops *registered[ENGINE_TIERS_BELOW];

/* The calling thread's: see tier.h, "The typed wait". */
static __thread enum engine_wait last_wait;

void engine_tier_register(enum engine_tier t, const struct tier_ops *ops)
{
	registered[t] = ops;
}

void **engine_tier_priv(struct engine *eng, enum engine_tier t)
{
	return &eng->tier_priv[t];
}

int engine_tier_flush(struct engine *eng, enum engine_tier t)
{
	const struct tier_ops *o = eng->tier[t];

	return o && o->flush ? o->flush(eng) : 0;
}

int tier_setup(struct engine *eng, const struct engine_config *cfg,
	       struct errbuf *e)
{
	bool named[ENGINE_TIERS_BELOW] = { cfg->disk != NULL, cfg->remote != NULL };
	static const char *const names[ENGINE_TIERS_BELOW] = { "disk", "remote" };

	for (int t = 0; t < ENGINE_TIERS_BELOW; t++) {
		if (named[t] && !registered[t])
			return errbuf_set(e, -EINVAL, "engine: a %s tier is configured "
					  "but its operations were not registered; "
					  "call engine_tier_register() at startup "
					  "(tier.h)", names[t]);
		eng->tier[t] = registered[t];
	}
	return 0;
}

int engine_wait_set(enum engine_wait why)
{
	last_wait = why;
	return -EINPROGRESS;
}

enum engine_wait engine_wait_take(void)
{
	enum engine_wait w = last_wait;

	last_wait = ENGINE_DONE;
	return w;
}

const char *engine_wait_name(enum engine_wait w)
{
	switch (w) {
	case ENGINE_DONE:         return "done";
	case ENGINE_WAIT_RECLAIM: return "the reclaimer";
	case ENGINE_WAIT_DISK:    return "the disk tier";
	case ENGINE_WAIT_REMOTE:  return "the remote tier";
	}
	return "?";
}

/* ------------------------------------------------------------ wrappers */

void tier_attach(struct engine *eng)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->attach)
			eng->tier[t]->attach(eng);
}

/* In reverse: the remote tier's holdings go after the disk reads land. */
void tier_detach(struct engine *eng)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->detach)
			eng->tier[t]->detach(eng);
}

int tier_fetch(struct engine *eng, uint64_t user, unsigned flags,
	       struct errbuf *e)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++) {
		const struct tier_ops *op = eng->tier[t];
		int ret;

		if (!op || !op->fetch)
			continue;
		ret = op->fetch(eng, user, flags, e);
		if (ret || user_table_find(&eng->users, user))
			return ret;
	}
	return 0;
}

int tier_fetch_one(struct engine *eng, enum engine_tier t, uint64_t user,
		   unsigned flags, struct errbuf *e)
{
	const struct tier_ops *op = eng->tier[t];

	return op && op->fetch ? op->fetch(eng, user, flags, e) : 0;
}

void tier_store(struct engine *eng, struct history *h)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->store)
			eng->tier[t]->store(eng, h);
}

int tier_forget(struct engine *eng, enum engine_tier t, uint64_t user,
		uint32_t sel, struct errbuf *e)
{
	const struct tier_ops *op = eng->tier[t];

	if (!op || !op->forget)
		return t == ENGINE_TIER_DISK ?
		       errbuf_set(e, -EINVAL, "user %" PRIu64 ": this pool has no "
				  "disk tier", user) : 0;
	return op->forget(eng, user, sel, e);
}

int tier_forget_all(struct engine *eng, enum engine_tier t, uint32_t sel)
{
	const struct tier_ops *op = eng->tier[t];

	if (!op || !op->forget_all)
		return t == ENGINE_TIER_DISK ? -EINVAL : 0;
	return op->forget_all(eng, sel);
}

bool tier_info(struct engine *eng, uint64_t user, struct engine_user_info *out)
{
	bool any = false;

	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->info)
			any |= eng->tier[t]->info(eng, user, out);
	return any;
}

void tier_stats(const struct engine *eng, struct kvp_stats *out)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->stats)
			eng->tier[t]->stats(eng, out);
}

void tier_list(struct engine *eng, uint64_t cursor, uint64_t *ids, uint64_t *n,
	       uint64_t cap)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->list)
			eng->tier[t]->list(eng, cursor, ids, n, cap);
}

uint64_t tier_list_count(struct engine *eng, uint64_t cursor)
{
	uint64_t n = 0;

	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->list_count)
			n += eng->tier[t]->list_count(eng, cursor);
	return n;
}

int tier_prefix_more(struct engine *eng, enum engine_tier t,
		     const uint32_t *tokens, uint32_t full, uint32_t *frames,
		     uint32_t *hit, uint32_t *idle, bool wait)
{
	const struct tier_ops *op = eng->tier[t];

	return op && op->prefix_more ?
	       op->prefix_more(eng, tokens, full, frames, hit, idle, wait) : 0;
}

bool tier_prefix_waiting(struct engine *eng)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->prefix_waiting &&
		    eng->tier[t]->prefix_waiting(eng))
			return true;
	return false;
}

void tier_demote_prefix(struct engine *eng, struct pc_entry *pe)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->demote_prefix)
			eng->tier[t]->demote_prefix(eng, pe);
}

void tier_demote_chunk(struct engine *eng, struct chunk *c)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->demote_chunk)
			eng->tier[t]->demote_chunk(eng, c);
}

int tier_chunk_restore(struct engine *eng, const struct kvp_chunk_id *id,
		       uint32_t type, bool wait, struct errbuf *e)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++) {
		const struct tier_ops *op = eng->tier[t];
		int ret;

		if (!op || !op->chunk_restore)
			continue;
		ret = op->chunk_restore(eng, id, type, wait, e);
		if (ret != -ENOENT)
			return ret;
	}
	return -ENOENT;
}

int tier_chunk_drop(struct engine *eng, const struct kvp_chunk_id *id)
{
	int n = 0;

	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->chunk_drop)
			n += eng->tier[t]->chunk_drop(eng, id);
	return n;
}

uint32_t tier_chunk_clear(struct engine *eng, uint32_t type)
{
	uint32_t n = 0;

	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->chunk_clear)
			n += eng->tier[t]->chunk_clear(eng, type);
	return n;
}

uint32_t tier_publish(struct engine *eng, uint32_t max_pages, bool *more)
{
	uint32_t n = 0;

	*more = false;
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++) {
		const struct tier_ops *op = eng->tier[t];
		bool m = false;

		if (!op || !op->publish)
			continue;
		n += op->publish(eng, max_pages - n, &m);
		*more |= m;
	}
	return n;
}

bool tier_chunk_kept(const struct engine *eng, uint32_t type)
{
	for (int t = 0; t < ENGINE_TIERS_BELOW; t++)
		if (eng->tier[t] && eng->tier[t]->chunk_kept &&
		    eng->tier[t]->chunk_kept(eng, type))
			return true;
	return false;
}
