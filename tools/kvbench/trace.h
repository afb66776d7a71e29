/* SPDX-License-Identifier: MIT */
/*
 * trace.h - the recommender pipeline's request trace: what `kvbench trace`
 * generates and writes, what `kvbench replay` feeds to the caches, and the
 * token model both use (../shared/WORKLOADS.md, section 1).
 *
 * A REQUEST is the end of one interval of one user's day, as a row of the
 * HSTU example's processed_batches.csv: (date, ts_ms, user, end) where end is
 * the user's history length that day after the interval (interval_indptr).
 * The pipeline sends that day's history capped at TRACE_CAP_ITEMS items; the
 * model sees [TRACE_CONTEXT_TOKENS contextual][item1, act1, item2, act2, ...]
 * so a history of h items is 6 + 2 * min(h, 4096) tokens, and only the part
 * after what is cached has to be computed. Histories do not cross days: the
 * cache key is (user, date) (trace_key()).
 *
 * THE FILE FORMAT, kvtrace version 1. Text, one request per line, in replay
 * order (date, then ts_ms, then user):
 *
 *     # kvtrace 1
 *     # users=1000 days=31 seed=1 first_date=20220408
 *     20220408 1649376123000 17 5 4410:1 83:65 120934:0 17:1 2204:64
 *     20220408 1649376190000 17 8 5521:1 98:0 7:65
 *
 * The first line must be "# kvtrace 1"; other lines starting with '#' are
 * comments (the generator writes its parameters there as key=value). Fields
 * are separated by single spaces:
 *   date     YYYYMMDD
 *   ts_ms    the interval's last event, epoch milliseconds (UTC)
 *   user     user id, < 2^24
 *   end      the user's history length that day after this interval (items)
 *   item:action ...  optional: the interval's events, item id and action
 *            bitmask (click 1, like 2, follow 4, comment 8, forward 16, hate
 *            32, long_view 64, profile_enter 128); when present there are
 *            exactly end - (the previous end of this user and date) of them.
 * The loader checks the order, that end grows within a (user, date), and the
 * event count where events are given; it keeps the counts, not the items.
 */
#ifndef KVBENCH_TRACE_H
#define KVBENCH_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define TRACE_CONTEXT_TOKENS 6u  /* contextual features, once per history */
#define TRACE_CAP_ITEMS 4096u    /* items of history the example sends at most */
#define TRACE_MAX_USER ((1u << 24) - 1)

/* KuaiRand-1K (WORKLOADS.md): history length per user. */
#define TRACE_HIST_MEDIAN 3379.0
#define TRACE_HIST_MEAN 5038.0
#define TRACE_HIST_SIGMA 0.894
#define TRACE_HIST_MIN 10u
#define TRACE_HIST_MAX 49332u
#define TRACE_INTERVAL_GAP_MS 60000u /* an event this long after the first of
				      * an interval starts a new one */

struct trace_req {
	uint64_t ts_ms;
	uint32_t user;
	uint32_t date;   /* YYYYMMDD */
	uint32_t end;    /* history items that day after this interval */
	uint32_t begin;  /* ... before it (the previous end; 0 first) */
	uint32_t kid;    /* dense index of (user, date): 0 .. nkeys-1 */
	uint32_t pad;
};

struct trace {
	struct trace_req *req;
	size_t n, cap;
	uint32_t nkeys;      /* distinct (user, date) */
	uint32_t users;      /* distinct users */
	uint32_t days;       /* distinct dates */
	/* How it was made (generator) or 0. */
	uint64_t seed;
	uint32_t gen_users, gen_days, first_date;
};

/* Tokens the model needs for a history of items items. */
static inline uint64_t trace_tokens(uint32_t items)
{
	return TRACE_CONTEXT_TOKENS +
	       2ull * (items < TRACE_CAP_ITEMS ? items : TRACE_CAP_ITEMS);
}

/* The cache key of a request: histories do not cross days. */
static inline uint64_t trace_key(uint32_t user, uint32_t date)
{
	return ((uint64_t)user << 32) | date;
}

/* What trace_generate() is asked for. */
struct trace_gen_opts {
	uint32_t users;      /* 1000 */
	uint32_t days;       /* 31: KuaiRand-1K spans 2022-04-08 .. 2022-05-08 */
	uint32_t first_date; /* 20220408 */
	uint64_t seed;
};

/*
 * Generate a KuaiRand-1K-like trace: user u's total history is a log-normal
 * (mu = ln 3379, sigma 0.894) clipped to [10, 49332], drawn stratified (one
 * draw per 1/users quantile band, the bands shuffled among users by the
 * seed, so the median and mean hold for any seed); it is spread over the
 * days with random daily weights; each day's events come in sessions
 * (a few to a few dozen events, gaps of 2 s plus an exponential of mean
 * 10 s) at random times; intervals are cut as the HSTU example cuts them.
 * Returns 0, or -ENOMEM / -EINVAL with a message in err.
 */
int trace_generate(struct trace *t, const struct trace_gen_opts *o, char *err,
		   size_t errlen);

/* The item and action of event k of (user, date) in a generated trace. */
void trace_event(uint64_t seed, uint32_t user, uint32_t date, uint32_t k,
		 uint32_t *item, uint32_t *action);

/* Write t in kvtrace 1 (events included when t was generated). 0 or -errno. */
int trace_write(const struct trace *t, FILE *f);

/* Read a kvtrace 1 file. 0, or -EINVAL (what and which line in err) / -errno. */
int trace_read(struct trace *t, FILE *f, const char *name, char *err,
	       size_t errlen);

/*
 * After t->req[0 .. n) was filled with (ts_ms, user, date, end): sort into
 * replay order (date, ts_ms, user), set begin and kid, count keys, users and
 * days. -EINVAL when a (user, date)'s end does not grow (message names the
 * row), -ENOMEM.
 */
int trace_finish(struct trace *t, char *err, size_t errlen);

/* Append one request (fields as trace_finish() wants them). 0 or -ENOMEM. */
int trace_push(struct trace *t, uint64_t ts_ms, uint32_t user, uint32_t date,
	       uint32_t end);

void trace_free(struct trace *t);

/* Per-user statistics of a trace: total history (sum over days of each
 * day's last end) of every user. */
struct trace_stats {
	size_t requests;
	uint32_t users, days, keys;
	uint64_t items;            /* sum of histories */
	uint32_t hist_min, hist_median, hist_max;
	double hist_mean;
	double items_per_request;  /* mean new items per request */
	double requests_per_key;   /* intervals per (user, day) */
	uint64_t tokens_needed;    /* sum over requests of trace_tokens(end) */
	uint64_t max_request_tokens;
};

int trace_stats(const struct trace *t, struct trace_stats *s);

/*
 * The generator's options, which `kvbench trace` and `kvbench replay` both
 * take: their getopt codes (above both subcommands' own) and their rows for
 * a long_opts table (<getopt.h>).
 */
enum { TRACE_OPT_USERS = 400, TRACE_OPT_DAYS, TRACE_OPT_SEED };
#define TRACE_GEN_LONG_OPTS						\
	{ "users", required_argument, NULL, TRACE_OPT_USERS },		\
	{ "days", required_argument, NULL, TRACE_OPT_DAYS },		\
	{ "seed", required_argument, NULL, TRACE_OPT_SEED }

/* Read generator option `code` of subcommand sub into *gen: -1 to go on or
 * the exit status (kvb_opt_*), -2 when code is not a generator option. */
int trace_gen_opt(const char *sub, struct trace_gen_opts *gen, int code,
		  const char *arg);

#endif /* KVBENCH_TRACE_H */
