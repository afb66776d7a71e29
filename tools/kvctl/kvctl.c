/* SPDX-License-Identifier: MIT */
/*
 * kvctl.c - the operator's CLI of kvpoold: the command line and the command
 * table.
 *
 * `kvctl [options] <command> [arguments] [options]`: options may come before
 * or after the command, so one option table serves every command and each
 * command says which of it it takes. Every word is read here and checked
 * (unknown options, values, combinations) before kvctl connects, so a typo
 * is exit status 2 with a message naming the word, whether or not a daemon
 * is running. Adding a command is one row in `cmds` and one cmd_<name>().
 *
 * What this file does not do: talk to the daemon (commands.c) or format
 * results (render.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "kvctl.h"

/* ---------------------------------------------------------------- options */

enum opt_id {
	OPT_SOCKET,
	OPT_JSON,
	OPT_HELP,
	OPT_VERSION,
	OPT_ALL_TENANTS,
	OPT_LIMIT,
	OPT_USER,
	OPT_ALL,
	OPT_TIER,
	OPT_CHUNK,
	OPT_TYPE,
	OPT_FILTER,
	OPT_CLEAR,
	OPT_EVICT_UNUSED,
	OPT_ENTRIES,
	OPT_WATCH,
	OPT_INTERVAL,
	OPT_COUNT,
	OPT_FROM,
	OPT_TO,
	NOPTS,
};

#define BIT(o) (1u << (o))
#define GLOBAL_OPTS (BIT(OPT_SOCKET) | BIT(OPT_JSON) | BIT(OPT_HELP) | BIT(OPT_VERSION))

static const struct opt_spec {
	const char *name;   /* long name, after "--" */
	char short_name;    /* 0: none */
	const char *arg;    /* the value's name in help; NULL: takes none */
	const char *help;
} opt_specs[NOPTS] = {
	[OPT_SOCKET] = { "socket", 0, "PATH",
			 "kvpoold's socket (else $KVPOOL_SOCKET, else " KVP_DEFAULT_SOCKET ")" },
	[OPT_JSON] = { "json", 0, NULL, "print one JSON object instead of a table" },
	[OPT_HELP] = { "help", 'h', NULL, "print help and exit" },
	[OPT_VERSION] = { "version", 'V', NULL, "print the version and exit" },
	[OPT_ALL_TENANTS] = { "all-tenants", 0, NULL,
			      "every tenant (admin): stats summed, evict of all" },
	[OPT_LIMIT] = { "limit", 0, "N", "list at most N users" },
	[OPT_USER] = { "user", 0, "ID", "the user id (decimal, 0 to 2^64-1)" },
	[OPT_ALL] = { "all", 0, NULL, "every unleased user: of every tenant for an "
				      "admin (offload: admin only), else of your tenant" },
	[OPT_TIER] = { "tier", 0, "TIER", "device, host, disk or all (default: all)" },
	[OPT_CHUNK] = { "chunk", 0, "ID", "a chunk id: 64 hex digits or a unique prefix" },
	[OPT_TYPE] = { "type", 0, "TYPE", "chunk type: system, context or query (default: all)" },
	[OPT_FILTER] = { "filter", 0, "JSON|K=V,...",
			 "only chunks whose metadata has every key with an equal value "
			 "(a JSON object, or key=value pairs of strings)" },
	[OPT_CLEAR] = { "clear", 0, NULL, "delete every chunk (of --type)" },
	[OPT_EVICT_UNUSED] = { "evict-unused", 0, "SECONDS",
			       "delete ready chunks nobody holds, idle that long" },
	[OPT_ENTRIES] = { "entries", 0, "NAME",
			  "a chunk's entries (where it was prefilled): parent, start" },
	[OPT_WATCH] = { "watch", 0, "SECONDS", "print the stats again every SECONDS" },
	[OPT_INTERVAL] = { "interval", 0, "SECONDS", "refresh every SECONDS (default 1)" },
	[OPT_COUNT] = { "count", 0, "N", "stop after N refreshes (default: at ^C)" },
	[OPT_FROM] = { "from", 0, "POOL", "the pool (GPU) the history is in: 0, 1, ..." },
	[OPT_TO] = { "to", 0, "POOL", "the pool (GPU) to move it to" },
};

/* The command line as read, before it is given meaning. */
struct cmdline {
	unsigned seen;               /* BIT(opt) for every option given */
	const char *val[NOPTS];      /* the value of each option that takes one */
	const char *pos[8];          /* words that are not options: command, args */
	size_t npos;
	bool too_many;               /* more words than pos holds */
};

/* ---------------------------------------------------------------- commands */

struct kvctl_cmd {
	const char *name;
	const char *synopsis;  /* what follows "kvctl NAME" in the usage line */
	const char *summary;
	unsigned opts;         /* BIT(opt) of the options it takes beyond the global ones */
	size_t nargs;          /* words it takes after its name */
	/* Give the words and options meaning; 0 or a usage error's exit status. */
	int (*check)(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		     struct kvctl_args *a);
	int (*run)(struct kvp_client *c, const struct kvctl_args *a);
};

static int check_none(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a);
static int check_users(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		       struct kvctl_args *a);
static int check_user(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a);
static int check_target(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a);
static int check_chunks(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a);
static int check_chunk(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		       struct kvctl_args *a);
static int check_repeat(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a);
static int check_move(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a);

static const struct kvctl_cmd cmds[] = {
	{ "stats", "[--all-tenants] [--watch SECONDS [--count N]]",
	  "tier occupancy, gauges and every engine counter",
	  BIT(OPT_ALL_TENANTS) | BIT(OPT_WATCH) | BIT(OPT_COUNT), 0, check_repeat,
	  cmd_stats },
	{ "top", "[--interval SECONDS] [--count N]",
	  "live view: rates per second, tiers, top users and tenants, op latency",
	  BIT(OPT_INTERVAL) | BIT(OPT_COUNT), 0, check_repeat, cmd_top },
	{ "users", "[--limit N]",
	  "list cached users (admins: of every tenant)",
	  BIT(OPT_LIMIT), 0, check_users, cmd_users },
	{ "user", "ID",
	  "one user's history: start, len, pages per tier, leases",
	  0, 1, check_user, cmd_user },
	{ "clients", "",
	  "list attached clients (admin)",
	  0, 0, check_none, cmd_clients },
	{ "reload", "",
	  "have kvpoold re-read its settings, as SIGHUP does (admin)",
	  0, 0, check_none, cmd_reload },
	{ "evict", "--user ID | --all | --all-tenants [--tier device|host|disk|all] | "
	  "--chunk ID",
	  "drop a user's pages, or every unleased user's (of your tenant; an admin's "
	  "--all and --all-tenants: of every tenant), or a chunk",
	  BIT(OPT_USER) | BIT(OPT_ALL) | BIT(OPT_ALL_TENANTS) | BIT(OPT_TIER) |
	  BIT(OPT_CHUNK), 0, check_target, cmd_evict },
	{ "offload", "--user ID | --all [--tier host|disk]",
	  "copy a user's device pages, or everyone's (admin), to the host tier; "
	  "--tier disk: write them to the disk tier and free their memory",
	  BIT(OPT_USER) | BIT(OPT_ALL) | BIT(OPT_TIER), 0, check_target, cmd_offload },
	{ "move", "--user ID | --chunk ID, --from POOL --to POOL",
	  "move a user's history to another pool (GPU) of your tenant, in one step; "
	  "or copy a chunk there (with the entries it hangs under)",
	  BIT(OPT_USER) | BIT(OPT_CHUNK) | BIT(OPT_FROM) | BIT(OPT_TO), 0, check_move,
	  cmd_move },
	{ "chunks", "[--type T] [--filter JSON|K=V,...] | --entries NAME | --clear [--type T] | "
	  "--evict-unused SECONDS",
	  "list the tenant's chunks (or one chunk's entries); or delete them (all, or "
	  "of a type), or the idle ones",
	  BIT(OPT_TYPE) | BIT(OPT_FILTER) | BIT(OPT_CLEAR) | BIT(OPT_EVICT_UNUSED) |
	  BIT(OPT_ENTRIES), 0, check_chunks, cmd_chunks },
	{ "chunk", "ID",
	  "one chunk: type, state, tokens, pages, holders, hits, metadata",
	  0, 1, check_chunk, cmd_chunk },
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static const struct kvctl_cmd *find_cmd(const char *name)
{
	for (size_t i = 0; i < NCMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			return &cmds[i];
	return NULL;
}

/* ---------------------------------------------------------------- help */

static void print_opt(FILE *f, const struct kvctl_cmd *cmd, enum opt_id o)
{
	const struct opt_spec *s = &opt_specs[o];
	const char *help = s->help;
	char lhs[56];

	/* offload's tiers are where the copy goes, not what is dropped. */
	if (o == OPT_TIER && cmd && !strcmp(cmd->name, "offload"))
		help = "host (default: a copy stays on the device) or disk (written "
		       "there, memory freed)";
	if (s->short_name)
		snprintf(lhs, sizeof(lhs), "-%c, --%s%s%s", s->short_name, s->name,
			 s->arg ? " " : "", s->arg ? s->arg : "");
	else
		snprintf(lhs, sizeof(lhs), "    --%s%s%s", s->name,
			 s->arg ? " " : "", s->arg ? s->arg : "");
	fprintf(f, "  %-22s %s\n", lhs, help);
}

static void print_footer(FILE *f)
{
	fprintf(f,
		"\n"
		"Options may come before or after the command.\n"
		"Exit status: 0 success, 1 the daemon was unreachable or refused or\n"
		"failed the operation, 2 bad command line.\n");
}

static void print_help(FILE *f)
{
	fprintf(f,
		"Usage: kvctl [options] <command> [arguments]\n"
		"       kvctl help [<command>]\n"
		"\n"
		"The operator's CLI of kvpoold, the shared KV-cache daemon.\n"
		"\n"
		"Commands:\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(f, "\nOptions:\n");
	for (int o = 0; o < NOPTS; o++)
		if (GLOBAL_OPTS & BIT(o))
			print_opt(f, NULL, (enum opt_id)o);
	print_footer(f);
	fprintf(f, "Run 'kvctl <command> --help' for a command's options; see kvctl(1).\n");
}

static void print_cmd_help(FILE *f, const struct kvctl_cmd *cmd)
{
	fprintf(f, "Usage: kvctl %s%s%s [--json] [--socket PATH]\n\nkvctl %s: %s.\n",
		cmd->name, *cmd->synopsis ? " " : "", cmd->synopsis, cmd->name,
		cmd->summary);
	fprintf(f, "\nOptions:\n");
	for (int o = 0; o < NOPTS; o++)
		if (cmd->opts & BIT(o))
			print_opt(f, cmd, (enum opt_id)o);
	for (int o = 0; o < NOPTS; o++)
		if (GLOBAL_OPTS & BIT(o))
			print_opt(f, cmd, (enum opt_id)o);
	print_footer(f);
}

static void list_cmds(FILE *f)
{
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "%s%s", i ? ", " : "", cmds[i].name);
}

__attribute__((format(printf, 2, 3)))
static int usage_error(const struct kvctl_cmd *cmd, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "kvctl: %s%s", cmd ? cmd->name : "", cmd ? ": " : "");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	if (cmd)
		fprintf(stderr, "\nTry 'kvctl %s --help'.\n", cmd->name);
	else
		fprintf(stderr, "\nTry 'kvctl --help'.\n");
	return KVCTL_EXIT_USAGE;
}

static int unknown_cmd(const char *name)
{
	fprintf(stderr, "kvctl: unknown command '%s'; valid commands: ", name);
	list_cmds(stderr);
	fprintf(stderr, "\nTry 'kvctl --help'.\n");
	return KVCTL_EXIT_USAGE;
}

/* ---------------------------------------------------------------- reading argv */

static int find_long(const char *name, size_t len)
{
	for (int o = 0; o < NOPTS; o++)
		if (strlen(opt_specs[o].name) == len && strncmp(opt_specs[o].name, name, len) == 0)
			return o;
	return -1;
}

static int find_short(char c)
{
	for (int o = 0; o < NOPTS; o++)
		if (opt_specs[o].short_name && opt_specs[o].short_name == c)
			return o;
	return -1;
}

/*
 * Sort argv into options and words. A word starting with '-' is an option
 * unless it is "-" or "-<digit>" (so `kvctl user -1` is told that -1 is no
 * user id rather than that -1 is no option); after "--" every word is a word.
 */
static int read_argv(int argc, char **argv, struct cmdline *cl)
{
	bool opts_done = false;

	memset(cl, 0, sizeof(*cl));
	for (int i = 1; i < argc; i++) {
		const char *w = argv[i], *val = NULL;
		int o;

		if (opts_done || w[0] != '-' || w[1] == '\0' ||
		    (w[1] >= '0' && w[1] <= '9')) {
			if (cl->npos < sizeof(cl->pos) / sizeof(cl->pos[0]))
				cl->pos[cl->npos++] = w;
			else
				cl->too_many = true;
			continue;
		}
		if (strcmp(w, "--") == 0) {
			opts_done = true;
			continue;
		}
		if (w[1] == '-') {
			const char *eq = strchr(w + 2, '=');
			size_t len = eq ? (size_t)(eq - (w + 2)) : strlen(w + 2);

			o = find_long(w + 2, len);
			if (o < 0)
				return usage_error(NULL, "unknown option '%.*s'", (int)(len + 2), w);
			if (eq && !opt_specs[o].arg)
				return usage_error(NULL, "option '--%s' takes no value", opt_specs[o].name);
			val = eq ? eq + 1 : NULL;
		} else {
			o = w[2] == '\0' ? find_short(w[1]) : -1;
			if (o < 0)
				return usage_error(NULL, "unknown option '%s'", w);
		}
		if (opt_specs[o].arg && !val) {
			if (i + 1 >= argc)
				return usage_error(NULL, "option '--%s' needs a value (%s)",
						   opt_specs[o].name, opt_specs[o].arg);
			val = argv[++i];
		}
		if ((cl->seen & BIT(o)) && opt_specs[o].arg)
			return usage_error(NULL, "option '--%s' given twice", opt_specs[o].name);
		cl->seen |= BIT(o);
		cl->val[o] = val;
	}
	return 0;
}

/* ---------------------------------------------------------------- values */

/* opt: the option the id came with ("--user: "), or "" for an argument. */
static int user_id(const struct kvctl_cmd *cmd, const char *opt, const char *s,
		   uint64_t *out)
{
	int rc = parse_u64(s, out);

	if (rc == -ERANGE)
		return usage_error(cmd, "%s'%s' is too large; user ids go up to %" PRIu64,
				   opt, s, UINT64_MAX);
	if (rc < 0)
		return usage_error(cmd, "%s'%s' is not a user id; user ids are decimal "
				   "numbers from 0 to %" PRIu64, opt, s, UINT64_MAX);
	return 0;
}

static int check_none(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a)
{
	return 0;
}

/* stats --watch S [--count N], top [--interval S] [--count N]. */
static int check_repeat(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a)
{
	const char *s;
	uint64_t v;

	a->interval_s = 1;
	if (!strcmp(cmd->name, "top") && (cl->seen & BIT(OPT_JSON)))
		return usage_error(cmd, "top draws a screen; for JSON samples use "
				   "'kvctl stats --watch SECONDS --json'");
	if (cl->seen & (BIT(OPT_WATCH) | BIT(OPT_INTERVAL))) {
		s = cl->val[cl->seen & BIT(OPT_WATCH) ? OPT_WATCH : OPT_INTERVAL];
		if (parse_u64(s, &v) < 0 || v == 0 || v > 86400)
			return usage_error(cmd, "'%s' is not a number of seconds; give "
					   "1 to 86400", s);
		a->interval_s = (uint32_t)v;
		a->watch = true;
	}
	if (cl->seen & BIT(OPT_COUNT)) {
		if (!strcmp(cmd->name, "stats") && !(cl->seen & BIT(OPT_WATCH)))
			return usage_error(cmd, "--count goes with --watch SECONDS");
		if (parse_u64(cl->val[OPT_COUNT], &a->count) < 0 || a->count == 0)
			return usage_error(cmd, "--count: '%s' is not a count; give a "
					   "number from 1", cl->val[OPT_COUNT]);
	}
	return 0;
}

static int check_users(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		       struct kvctl_args *a)
{
	const char *s = cl->val[OPT_LIMIT];
	int rc;

	if (!(cl->seen & BIT(OPT_LIMIT)))
		return 0;
	rc = parse_u64(s, &a->limit);
	if (rc < 0 || a->limit == 0)
		return usage_error(cmd, "--limit: '%s' is not a count; give a number "
				   "from 1 to %" PRIu64, s, UINT64_MAX);
	return 0;
}

static int check_user(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a)
{
	return user_id(cmd, "", cl->pos[1], &a->user);
}

static int chunk_id(const struct kvctl_cmd *cmd, const char *opt, const char *s,
		    struct kvctl_args *a)
{
	if (parse_chunk_prefix(s, a->chunk) < 0)
		return usage_error(cmd, "%s'%s' is not a chunk id; give its 64 hex "
				   "digits or a prefix of them (as 'kvctl chunks' shows)",
				   opt, s);
	a->has_chunk = true;
	return 0;
}

static int check_chunk(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		       struct kvctl_args *a)
{
	return chunk_id(cmd, "", cl->pos[1], a);
}

/* chunks: list (with --type, --filter), --clear (with --type) or
 * --evict-unused, one at a time. */
static int check_chunks(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a)
{
	const char *t = cl->val[OPT_TYPE];
	uint64_t secs;
	int type;

	a->clear = cl->seen & BIT(OPT_CLEAR);
	a->evict_unused = cl->seen & BIT(OPT_EVICT_UNUSED);
	if (a->clear && a->evict_unused)
		return usage_error(cmd, "give --clear or --evict-unused, not both");
	if ((a->clear || a->evict_unused) && (cl->seen & BIT(OPT_FILTER)))
		return usage_error(cmd, "--filter only selects what is listed; it does "
				   "not apply to --clear or --evict-unused");
	if (a->evict_unused && (cl->seen & BIT(OPT_TYPE)))
		return usage_error(cmd, "--evict-unused applies to every type; drop --type");
	if (cl->seen & BIT(OPT_ENTRIES)) {
		if (cl->seen & (BIT(OPT_TYPE) | BIT(OPT_FILTER) | BIT(OPT_CLEAR) |
				BIT(OPT_EVICT_UNUSED)))
			return usage_error(cmd, "--entries NAME lists one chunk's entries; "
					   "it does not combine with --type, --filter, "
					   "--clear or --evict-unused");
		a->entries = true;
		return chunk_id(cmd, "--entries: ", cl->val[OPT_ENTRIES], a);
	}
	if (cl->seen & BIT(OPT_TYPE)) {
		type = kvp_chunk_type_parse(t);
		if (type < 0)
			return usage_error(cmd, "--type: '%s' is not a chunk type; valid "
					   "types: system, context, query", t);
		a->chunk_type = (uint32_t)type;
	}
	if (cl->seen & BIT(OPT_FILTER)) {
		a->filter = cl->val[OPT_FILTER];
		if ((a->filter[0] != '{' && !strchr(a->filter, '=')) ||
		    strlen(a->filter) >= KVP_CHUNK_META_MAX)
			return usage_error(cmd, "--filter: '%s' is neither a JSON object "
					   "nor key=value pairs (k=v,k2=v2), under %d "
					   "bytes", a->filter, KVP_CHUNK_META_MAX);
	}
	if (a->evict_unused) {
		if (parse_u64(cl->val[OPT_EVICT_UNUSED], &secs) < 0 || secs > UINT32_MAX)
			return usage_error(cmd, "--evict-unused: '%s' is not a number of "
					   "seconds (0 to %" PRIu32 ")",
					   cl->val[OPT_EVICT_UNUSED], UINT32_MAX);
		a->max_age_s = (uint32_t)secs;
	}
	return 0;
}

/* evict and offload: exactly one of --user ID and --all (evict: or
 * --all-tenants, which is --all over every tenant); evict's --tier; or
 * evict --chunk ID alone. */
static int check_target(const struct kvctl_cmd *cmd, const struct cmdline *cl,
			struct kvctl_args *a)
{
	bool user = cl->seen & BIT(OPT_USER);
	int rc;

	a->all = cl->seen & (BIT(OPT_ALL) | BIT(OPT_ALL_TENANTS));
	if (cl->seen & BIT(OPT_CHUNK)) {
		if (user || a->all || (cl->seen & BIT(OPT_TIER)))
			return usage_error(cmd, "--chunk ID deletes one chunk; it does not "
					   "combine with --user, --all, --all-tenants "
					   "or --tier");
		return chunk_id(cmd, "--chunk: ", cl->val[OPT_CHUNK], a);
	}
	if (user && a->all)
		return usage_error(cmd, "give --user ID or --all, not both");
	if (!user && !a->all)
		return usage_error(cmd, "say whom: --user ID or --all%s",
				   cmd->opts & BIT(OPT_ALL_TENANTS) ?
				   " (or --all-tenants)" : "");
	if (user) {
		rc = user_id(cmd, "--user: ", cl->val[OPT_USER], &a->user);
		if (rc)
			return rc;
	}
	a->sel = KVP_SEL_ALL;
	if ((cl->seen & BIT(OPT_TIER)) && (parse_tier_sel(cl->val[OPT_TIER], &a->sel) < 0 ||
					   a->sel == KVP_SEL_TO_DISK))
		return usage_error(cmd, "--tier: '%s' is not a tier; valid tiers: "
				   "device, host, disk, all", cl->val[OPT_TIER]);
	/* offload: to the host tier, or pushed down to the disk tier. */
	if (!strcmp(cmd->name, "offload") && (cl->seen & BIT(OPT_TIER))) {
		if (a->sel != KVP_SEL_HOST && a->sel != KVP_SEL_DISK)
			return usage_error(cmd, "--tier: offload goes to host or disk, "
					   "not '%s'", cl->val[OPT_TIER]);
		a->sel = a->sel == KVP_SEL_DISK ? KVP_SEL_TO_DISK : KVP_SEL_ALL;
	}
	return 0;
}

/* --from / --to: a pool index (the daemon says which it serves). */
static int pool_index(const struct kvctl_cmd *cmd, const char *opt, const char *s,
		      uint32_t *out)
{
	uint64_t v;

	if (parse_u64(s, &v) < 0 || v >= KVP_POOLS_MAX)
		return usage_error(cmd, "%s'%s' is not a pool; pools are numbered "
				   "0 to %d (kvctl stats lists them)", opt, s,
				   KVP_POOLS_MAX - 1);
	*out = (uint32_t)v;
	return 0;
}

static int check_move(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		      struct kvctl_args *a)
{
	int rc;

	bool user = cl->seen & BIT(OPT_USER), chunk = cl->seen & BIT(OPT_CHUNK);

	if (user == chunk)
		return usage_error(cmd, user ? "--user and --chunk: name one" :
				   "say what: --user ID (a history) or --chunk ID");
	if (!(cl->seen & BIT(OPT_FROM)) || !(cl->seen & BIT(OPT_TO)))
		return usage_error(cmd, "say where from and to: --from POOL --to POOL");
	rc = chunk ? chunk_id(cmd, "--chunk: ", cl->val[OPT_CHUNK], a) :
		     user_id(cmd, "--user: ", cl->val[OPT_USER], &a->user);
	if (!rc)
		rc = pool_index(cmd, "--from: ", cl->val[OPT_FROM], &a->from);
	if (!rc)
		rc = pool_index(cmd, "--to: ", cl->val[OPT_TO], &a->to);
	if (!rc && a->from == a->to)
		return usage_error(cmd, "--from and --to are both pool %u; name two "
				   "pools", a->from);
	return rc;
}

/* Options cmd does not take, too many or too few words: a usage error. */
static int check_opts(const struct kvctl_cmd *cmd, const struct cmdline *cl)
{
	unsigned extra = cl->seen & ~(GLOBAL_OPTS | cmd->opts);

	for (int o = 0; o < NOPTS; o++)
		if (extra & BIT(o))
			return usage_error(cmd, "option '--%s' does not apply to '%s'",
					   opt_specs[o].name, cmd->name);
	if (cl->too_many || cl->npos - 1 > cmd->nargs)
		return usage_error(cmd, "unexpected argument '%s'",
				   cl->npos > cmd->nargs + 1 ? cl->pos[cmd->nargs + 1] : "...");
	if (cl->npos - 1 < cmd->nargs)
		return usage_error(cmd, "missing an argument; usage: kvctl %s %s",
				   cmd->name, cmd->synopsis);
	return 0;
}

/* ---------------------------------------------------------------- main */

/* The socket to use and, for a hint when nothing listens there, where the
 * path came from. */
static const char *socket_path(const struct cmdline *cl, const char **hint)
{
	const char *env = getenv("KVPOOL_SOCKET");

	*hint = NULL;
	if (cl->seen & BIT(OPT_SOCKET))
		return cl->val[OPT_SOCKET];
	if (env && *env) {
		*hint = "the path came from $KVPOOL_SOCKET; --socket PATH overrides it";
		return env;
	}
	*hint = "that is the default socket; --socket PATH or $KVPOOL_SOCKET names another";
	return KVP_DEFAULT_SOCKET;
}

static int run_cmd(const struct kvctl_cmd *cmd, const struct cmdline *cl,
		   const struct kvctl_args *a)
{
	struct kvp_connect_opts opts = { .name = "kvctl" };
	char err[KVP_ERRLEN] = "";
	struct kvctl_args args = *a;
	struct kvp_client *c;
	const char *hint;
	int rc;

	opts.socket = args.socket = socket_path(cl, &hint);
	rc = kvp_connect(&c, &opts, err, sizeof(err));
	if (rc < 0) {
		fprintf(stderr, "kvctl: %s\n", err[0] ? err : strerror(-rc));
		if (hint && (rc == -ENOENT || rc == -ECONNREFUSED))
			fprintf(stderr, "kvctl: %s\n", hint);
		return KVCTL_EXIT_FAIL;
	}
	rc = cmd->run(c, &args);
	kvp_close(c);
	return rc;
}

int main(int argc, char **argv)
{
	const struct kvctl_cmd *cmd;
	struct kvctl_args a = { .sel = KVP_SEL_ALL };
	struct cmdline cl;
	int rc;

	rc = read_argv(argc, argv, &cl);
	if (rc)
		return rc;
	if (cl.npos && strcmp(cl.pos[0], "help") == 0) {
		if (cl.npos > 2 || cl.too_many)
			return usage_error(NULL, "help takes at most one command");
		if (cl.npos == 1) {
			print_help(stdout);
			return KVCTL_EXIT_OK;
		}
		cmd = find_cmd(cl.pos[1]);
		if (!cmd)
			return unknown_cmd(cl.pos[1]);
		print_cmd_help(stdout, cmd);
		return KVCTL_EXIT_OK;
	}
	cmd = cl.npos ? find_cmd(cl.pos[0]) : NULL;
	if (cl.npos && !cmd)
		return unknown_cmd(cl.pos[0]);
	if (cl.seen & BIT(OPT_HELP)) {
		if (cmd)
			print_cmd_help(stdout, cmd);
		else
			print_help(stdout);
		return KVCTL_EXIT_OK;
	}
	if (cl.seen & BIT(OPT_VERSION)) {
		int v = kvp_version();

		printf("kvctl %d.%d (libkvpool %d.%d)\n", KVP_VERSION_MAJOR,
		       KVP_VERSION_MINOR, v / 1000, v % 1000);
		return KVCTL_EXIT_OK;
	}
	if (!cmd) {
		fprintf(stderr, "kvctl: no command given; valid commands: ");
		list_cmds(stderr);
		fprintf(stderr, "\nTry 'kvctl --help'.\n");
		return KVCTL_EXIT_USAGE;
	}
	rc = check_opts(cmd, &cl);
	if (rc)
		return rc;
	if ((cl.seen & BIT(OPT_SOCKET)) && !*cl.val[OPT_SOCKET])
		return usage_error(cmd, "--socket: the path is empty");
	a.json = cl.seen & BIT(OPT_JSON);
	a.all_tenants = cl.seen & BIT(OPT_ALL_TENANTS);
	rc = cmd->check(cmd, &cl, &a);
	if (rc)
		return rc;

	rc = run_cmd(cmd, &cl, &a);
	/* A full disk or a closed pipe must not look like success. */
	if (fflush(stdout) != 0 || ferror(stdout)) {
		fprintf(stderr, "kvctl: writing the output: %s\n", strerror(errno));
		return KVCTL_EXIT_FAIL;
	}
	return rc;
}
