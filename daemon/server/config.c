/* SPDX-License-Identifier: MIT */
/*
 * config.c - kvpool.conf (parsed by libinih), the flags and the final
 * checks; the settings table and its setters are config_settings.c.
 *
 * One table lists every setting once: its key (the same in the file and as
 * --key=value), whether it is valid globally, in a [tenant NAME] section or
 * both, its setter and its --help line. The file and the flags both go
 * through the table, so they cannot drift apart. Checks that need more than
 * one value (device_mem against the layout's page size, a uid in two
 * tenants) run once everything is read, in config_check().
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <unistd.h>

#include "config.h"
#include "config_settings.h"
#include "kvpool_engine.h" /* RECLAIM_AUTO */
#include "log.h"
#include "proto.h"

/* ------------------------------------------------------------ messages */

/* The last error config_load() reported: a reload (which runs with
 * standard error perhaps /dev/null) logs it and hands it to kvctl. */
static char last_error[640];

const char *config_last_error(void)
{
	return last_error;
}

/*
 * An error in the settings, on standard error; under journald with its
 * priority first ("<3>", err), so `journalctl -p warning` shows why a
 * start failed.
 */
__attribute__((format(printf, 2, 3)))
static int usage_err(const char *where, const char *fmt, ...)
{
	int n = snprintf(last_error, sizeof(last_error), "%s: ", where);
	va_list ap;

	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(last_error))
		vsnprintf(last_error + n, sizeof(last_error) - (size_t)n, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%skvpoold: %s\n", log_stderr_is_journal() ? "<3>" : "",
		last_error);
	return EXIT_USAGE;
}

static void print_help(void)
{
	printf("Usage: kvpoold [--config=PATH] [--KEY=VALUE ...]\n"
	       "       kvpoold --help | --version\n\n"
	       "The kvpool daemon: serves a shared KV-cache page pool to local clients.\n\n"
	       "  -c, --config=PATH     read settings from PATH (kvpool.conf(5)); flags override it\n"
	       "  -f                    same as --foreground\n"
	       "  --tenant=NAME[:uids=L][:gids=L][:device_mem=S][:host_mem=S][:max_tokens_per_user=N]\n"
	       "              [:max_chunks=N][:chunk_memory_ratio=R][:hash_salt=SECRET]\n"
	       "              [:prefix_caching=BOOL][:max_seq_tokens=N][:max_seqs=N]\n"
	       "                        define a tenant (replaces a file tenant of that name)\n"
	       "  -h, --help            this text\n"
	       "  -V, --version         the version\n\nSettings (--KEY=VALUE, or KEY = VALUE in the file):\n");
	for (size_t i = 0; i < nsettings; i++) {
		char lhs[48];

		if (!(settings[i].scope & G))
			continue;
		snprintf(lhs, sizeof(lhs), "--%s=%s", settings[i].key, settings[i].arg);
		printf("  %-27s %s\n", lhs, settings[i].help);
	}
	printf("\nSIZE takes K, M, G or T (binary). LIST is comma-separated ids or names.\n"
	       "See kvpoold(8) and kvpool.conf(5).\n");
}

/* ------------------------------------------------------------ applying */

static int apply(struct config *c, struct tenant_config *t, const char *where,
		 const char *key, const char *val)
{
	const struct setting *s = setting_find(key);
	char err[384];
	int ret;

	if (!s)
		return usage_err(where, "unknown setting '%s' (see kvpoold --help "
				 "and kvpool.conf(5))", key);
	if (t && !(s->scope & T))
		return usage_err(where, "%s is a global setting; put it before the "
				 "first [tenant] section", key);
	if (!t && !(s->scope & G))
		return usage_err(where, "%s belongs in a [tenant NAME] section "
				 "(or --tenant=NAME:%s=...)", key, key);
	err[0] = '\0';
	ret = s->set(c, t, val, err, sizeof(err));
	if (ret == -ENOMEM)
		return usage_err(where, "out of memory");
	if (ret)
		return usage_err(where, "%s = '%s': %s", key,
				 (s->scope & S) ? "(secret)" : val, err);
	return 0;
}

static struct tenant_config *tenant_add(struct config *c, const char *name,
					const char *origin, bool replace)
{
	struct tenant_config *t = NULL, *v;

	for (uint32_t i = 0; i < c->ntenants; i++)
		if (strcmp(c->tenants[i].name, name) == 0)
			t = &c->tenants[i];
	if (t && !replace)
		return NULL; /* the caller reports the duplicate */
	if (!t) {
		v = realloc(c->tenants, (c->ntenants + 1) * sizeof(*v));
		if (!v)
			return NULL;
		c->tenants = v;
		t = &v[c->ntenants++];
	} else {
		id_list_free(&t->uids);
		id_list_free(&t->gids);
	}
	*t = (struct tenant_config){ 0 };
	snprintf(t->name, sizeof(t->name), "%s", name);
	snprintf(t->origin, sizeof(t->origin), "%s", origin);
	return t;
}

/* "tenant NAME" (a section's title) -> the new tenant; NULL after
 * reporting why not. */
static struct tenant_config *file_section(struct config *c, const char *title,
					  const char *where, int *ret)
{
	char name[TENANT_NAME_MAX + 1], err[160], copy[256];
	struct tenant_config *t;

	*ret = EXIT_USAGE;
	snprintf(copy, sizeof(copy), "%s", title);
	if (strncmp(copy, "tenant", 6) || (copy[6] != ' ' && copy[6] != '\t')) {
		usage_err(where, "'[%s]': the only section is [tenant NAME]", title);
		return NULL;
	}
	if (parse_tenant_name(str_trim(copy + 7), name, err, sizeof(err))) {
		usage_err(where, "[tenant %s]: %s", str_trim(copy + 7), err);
		return NULL;
	}
	t = tenant_add(c, name, where, false);
	if (!t)
		usage_err(where, "[tenant %s] is defined twice (or out of memory)", name);
	else
		*ret = 0;
	return t;
}

/*
 * kvpool.conf is parsed by libinih (Debian's libinih-dev): sections, keys,
 * values, comments, a BOM. It is told what kvpool.conf(5) says the format
 * is: no continuation lines, '#' and ';' comments ('#' also after a blank
 * on a line), lines of any length, stop at the first error. Its handler
 * knows no line numbers (Debian builds it without INI_HANDLER_LINENO), so
 * lines are counted by the reader below, which is also where a read error
 * is told apart from the end of the file.
 */
struct file_ctx {
	struct config *c;
	FILE *f;
	const char *path;
	unsigned lineno;            /* of the line being parsed */
	bool line_done;             /* the last chunk read ended a line */
	unsigned headers;           /* "[...]" lines read so far */
	unsigned header_line;       /* where the last one was */
	unsigned applied;           /* headers whose section is applied */
	struct tenant_config *t;    /* its tenant */
	int ret;                    /* EXIT_USAGE once something was reported */
};

static char *file_reader(char *str, int num, void *stream)
{
	struct file_ctx *x = stream;
	size_t n;

	if (x->ret)
		return NULL; /* an error was reported: read no further */
	errno = 0;
	if (!fgets(str, num, x->f))
		return NULL; /* the end, or an error: config_read asks ferror() */
	if (x->line_done) {
		x->lineno++;
		/* Only counted (libinih parses it): a section that repeats the
		 * previous one's title is still a new section. */
		if (str[strspn(str, " \t")] == '[') {
			x->headers++;
			x->header_line = x->lineno;
		}
	}
	n = strlen(str);
	/* A long line comes in chunks; the next one continues this line. */
	x->line_done = n && str[n - 1] == '\n';
	return str;
}

static void file_where(const struct file_ctx *x, char *where, size_t len)
{
	snprintf(where, len, "%s:%u", x->path, x->lineno);
}

/* One key = value of the file; 1 to go on, 0 after reporting an error. */
static int file_pair(void *user, const char *section, const char *key,
		     const char *value)
{
	struct file_ctx *x = user;
	char where[PATH_MAX + 32], *val;
	size_t n = strlen(value);

	if (x->applied != x->headers) {
		x->applied = x->headers;
		snprintf(where, sizeof(where), "%s:%u", x->path, x->header_line);
		x->t = file_section(x->c, section, where, &x->ret);
		if (x->ret)
			return 0;
	}
	file_where(x, where, sizeof(where));
	/* "a quoted value": the quotes are not part of it. */
	if (n >= 2 && value[0] == '"' && value[n - 1] == '"') {
		value++;
		n -= 2;
	}
	val = strndup(value, n);
	x->ret = val ? apply(x->c, x->t, where, key, val) : usage_err(where, "out of memory");
	free(val);
	return !x->ret;
}

/*
 * fgets() returns NULL at the end of the file and on a read error alike
 * (EISDIR for a directory, EIO): only feof() tells them apart. Taking an
 * error for the end would start kvpoold on what was read so far, or on
 * the built-in defaults (no tenants: anyone who reaches the socket). A
 * line that ends in an error is not applied either: it may be cut short.
 */
int config_read(struct config *c, FILE *f, const char *path)
{
	struct file_ctx x = { .c = c, .f = f, .path = path, .line_done = true };
	char where[PATH_MAX + 32];
	int line;

	ini_allow_multiline = false;
	ini_start_comment_prefixes = "#;";
	ini_allow_inline_comments = true;
	ini_inline_comment_prefixes = "#";
	ini_use_stack = false;
	ini_allow_realloc = true;
	ini_max_line = 1 << 20;
	ini_stop_on_first_error = true;
	ini_allow_no_value = false;
	line = ini_parse_stream(file_reader, &x, file_pair, &x);
	if (x.ret)
		return x.ret;
	if (line > 0 && !ferror(f)) {
		snprintf(where, sizeof(where), "%s:%d", path, line);
		return usage_err(where, "expected 'key = value' or '[tenant NAME]'");
	}
	if (ferror(f) || !feof(f)) {
		int err = errno ? errno : EIO;

		snprintf(where, sizeof(where), "--config=%s", path);
		if (x.lineno)
			return usage_err(where, "read error after line %u: %s; kvpoold "
					 "did not start (fix the file or give another)",
					 x.lineno, strerror(err));
		return usage_err(where, "cannot read: %s; kvpoold did not start "
				 "(give the path of a kvpool.conf(5) file)", strerror(err));
	}
	if (line == -2)
		return usage_err(path, "out of memory");
	return 0;
}

static int load_file(struct config *c, const char *path)
{
	char where[PATH_MAX + 32];
	FILE *f = fopen(path, "re");
	int ret;

	if (!f) {
		snprintf(where, sizeof(where), "--config=%s", path);
		return usage_err(where, "cannot open: %s; kvpoold did not start "
				 "(give the path of a kvpool.conf(5) file)",
				 strerror(errno));
	}
	ret = config_read(c, f, path);
	fclose(f);
	return ret;
}

/* --tenant=NAME:key=value:key=value */
static int flag_tenant(struct config *c, const char *arg)
{
	char *copy = strdup(arg), *save = NULL, *tok, err[160];
	char name[TENANT_NAME_MAX + 1], where[96];
	struct tenant_config *t;
	int ret = 0;

	if (!copy)
		return usage_err("--tenant", "out of memory");
	snprintf(where, sizeof(where), "--tenant=%.80s", arg);
	tok = strtok_r(copy, ":", &save);
	if (!tok || parse_tenant_name(tok, name, err, sizeof(err))) {
		ret = usage_err(where, "%s", tok ? err : "give NAME:uids=...");
		goto out;
	}
	t = tenant_add(c, name, "--tenant", true);
	if (!t) {
		ret = usage_err(where, "out of memory");
		goto out;
	}
	while (!ret && (tok = strtok_r(NULL, ":", &save))) {
		char *eq = strchr(tok, '=');

		if (!eq) {
			ret = usage_err(where, "'%s': expected key=value", tok);
			break;
		}
		*eq = '\0';
		ret = apply(c, t, where, tok, eq + 1);
	}
out:
	free(copy);
	return ret;
}

/* ------------------------------------------------------------ flags */

enum flag_kind { FLAG_SETTING, FLAG_HELP, FLAG_VERSION };

/*
 * Split argv[*i] into key and value ("--key=value", "--key value", a bare
 * boolean "--foreground", and the short -c -f -h -V); advances *i past a
 * value taken from the next argument. keybuf receives the key with '-'
 * turned into '_' so --device-mem works as well as --device_mem.
 */
static int flag_split(int argc, char **argv, int *i, char *keybuf, size_t klen,
		      const char **val, enum flag_kind *kind)
{
	const char *a = argv[*i], *eq;
	const struct setting *s;
	size_t n;

	*kind = FLAG_SETTING;
	if (!strcmp(a, "-h") || !strcmp(a, "--help"))
		return *kind = FLAG_HELP, 0;
	if (!strcmp(a, "-V") || !strcmp(a, "--version"))
		return *kind = FLAG_VERSION, 0;
	if (!strcmp(a, "-f")) {
		snprintf(keybuf, klen, "foreground");
		*val = "yes";
		return 0;
	}
	if (!strcmp(a, "-c"))
		a = "--config";
	if (strncmp(a, "--", 2) || !a[2])
		return usage_err(a, "unexpected argument; settings are --key=value "
				 "(see kvpoold --help)");
	a += 2;
	eq = strchr(a, '=');
	n = eq ? (size_t)(eq - a) : strlen(a);
	if (n >= klen)
		return usage_err(argv[*i], "unknown flag (see kvpoold --help)");
	for (size_t k = 0; k < n; k++)
		keybuf[k] = a[k] == '-' ? '_' : a[k];
	keybuf[n] = '\0';
	if (eq) {
		*val = eq + 1;
		return 0;
	}
	s = setting_find(keybuf);
	if (s && (s->scope & B)) {
		*val = "yes";
		return 0;
	}
	if (*i + 1 >= argc)
		return usage_err(argv[*i], "needs a value: --%s=VALUE", keybuf);
	*val = argv[++*i];
	return 0;
}

/*
 * Pass 0 only looks for --help, --version and --config; pass 1 applies
 * every setting, so the command line overrides the file read in between.
 */
static int parse_flags(struct config *c, int argc, char **argv, int pass)
{
	for (int i = 1; i < argc; i++) {
		char key[64], where[128];
		enum flag_kind kind;
		const char *val = NULL;
		int ret = flag_split(argc, argv, &i, key, sizeof(key), &val, &kind);

		if (ret)
			return ret;
		if (kind == FLAG_HELP || kind == FLAG_VERSION) {
			if (pass == 0 && kind == FLAG_HELP)
				print_help();
			else if (pass == 0)
				printf("kvpoold (kvpool) %d.%d, protocol %d\n",
				       KVP_VERSION_MAJOR, KVP_VERSION_MINOR,
				       KVP_PROTO_VERSION);
			return CONFIG_EXIT_OK;
		}
		if (!strcmp(key, "config")) {
			if (pass == 0 && set_str(&c->config_path, val))
				return usage_err("--config", "out of memory");
			continue;
		}
		if (pass == 0)
			continue;
		if (!strcmp(key, "tenant")) {
			ret = flag_tenant(c, val);
		} else {
			snprintf(where, sizeof(where), "--%s", key);
			ret = apply(c, NULL, where, key, val);
		}
		if (ret)
			return ret;
	}
	return 0;
}

/* ------------------------------------------------------------ checks */

void config_devices_format(const struct config *c, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (uint32_t i = 0; i < c->ndevices && off < len; i++) {
		int n = snprintf(buf + off, len - off, "%s%d", i ? "," : "",
				 c->devices[i]);

		if (n < 0)
			break;
		off += (size_t)n;
	}
}

uint32_t config_frames(const struct config *c, uint64_t bytes)
{
	return (uint32_t)(bytes / c->layout.page_bytes);
}

static int check_mem(const struct config *c, const char *who, const char *key,
		     uint64_t bytes, uint64_t min_frames, uint64_t max_frames)
{
	uint64_t pb = c->layout.page_bytes, frames = bytes / pb;

	if (frames < min_frames)
		return usage_err(who, "%s = %" PRIu64 " bytes holds no page of the "
				 "layout (%" PRIu64 " bytes per page); use at least "
				 "%" PRIu64 "K", key, bytes, pb, (pb + 1023) / 1024);
	if (frames > max_frames)
		return usage_err(who, "%s = %" PRIu64 " bytes is %" PRIu64 " pages; "
				 "at most %" PRIu64 " pages of %" PRIu64 " bytes fit "
				 "one tier", key, bytes, frames, max_frames, pb);
	return 0;
}

static int check_max_tokens(const struct config *c, const char *who, uint64_t v)
{
	if (v && v < c->layout.page_tokens)
		return usage_err(who, "max_tokens_per_user = %" PRIu64 " is less than "
				 "one page (%" PRIu32 " tokens); use 0 for unlimited "
				 "or at least %" PRIu32, v, c->layout.page_tokens,
				 c->layout.page_tokens);
	return 0;
}

/* A uid (or gid) maps to one tenant: two would make the mapping a guess. */
static int check_members(const struct config *c, uint32_t ti, bool groups)
{
	const struct tenant_config *t = &c->tenants[ti];
	const struct id_list *l = groups ? &t->gids : &t->uids;

	for (uint32_t k = 0; k < l->n; k++)
		for (uint32_t j = 0; j < ti; j++)
			if (id_list_has(groups ? &c->tenants[j].gids :
					&c->tenants[j].uids, l->v[k]))
				return usage_err(t->origin, "%s %" PRIu32 " is in "
						 "tenants %s and %s; it may "
						 "belong to one tenant only",
						 groups ? "gid" : "uid", l->v[k],
						 c->tenants[j].name, t->name);
	return 0;
}

static int check_tenant(struct config *c, uint32_t ti)
{
	struct tenant_config *t = &c->tenants[ti];
	char who[128];
	int ret;

	snprintf(who, sizeof(who), "%s: [tenant %s]", t->origin, t->name);
	if (!t->uids.n && !t->gids.n)
		return usage_err(who, "no uids= or gids=: no client could ever "
				 "belong to it");
	if (!t->has_device_mem)
		t->device_mem = c->device_mem;
	if (!t->has_host_mem)
		t->host_mem = c->host_mem;
	if (!t->has_max_tokens)
		t->max_tokens = c->max_tokens_per_user;
	if (!t->has_max_chunks)
		t->max_chunks = c->max_chunks;
	if (!t->has_chunk_memory_ratio)
		t->chunk_memory_ratio = c->chunk_memory_ratio;
	if (!t->has_prefix_caching)
		t->seq.no_caching = c->seq.no_caching;
	if (!t->has_max_seq_tokens)
		t->seq.max_seq_tokens = c->seq.max_seq_tokens;
	if (!t->has_max_seqs)
		t->seq.max_seqs = c->seq.max_seqs;
	ret = check_mem(c, who, "device_mem", t->device_mem, 1, INT32_MAX);
	if (!ret)
		ret = check_mem(c, who, "host_mem", t->host_mem, 0, UINT32_MAX - 1);
	if (!ret)
		ret = check_max_tokens(c, who, t->max_tokens);
	if (!ret && t->has_disk_size && (!c->disk_dir || t->disk_size > c->disk_size))
		ret = usage_err(who, "disk_size = %" PRIu64 " is a quota of the disk "
				"tier, which is %" PRIu64 " bytes; set disk_dir and a "
				"disk_size at least as large", t->disk_size,
				c->disk_dir ? c->disk_size : 0);
	if (!ret)
		ret = check_members(c, ti, false);
	if (!ret)
		ret = check_members(c, ti, true);
	return ret;
}

/* Relative paths would break once a daemon chdir()s to /. */
static int make_absolute(char **path)
{
	char cwd[PATH_MAX], *abs;

	if (!*path || (*path)[0] == '/' || !strcmp(*path, "stderr") ||
	    !strcmp(*path, "syslog"))
		return 0;
	if (!getcwd(cwd, sizeof(cwd)) || asprintf(&abs, "%s/%s", cwd, *path) < 0)
		return usage_err(*path, "cannot make the path absolute");
	free(*path);
	*path = abs;
	return 0;
}

static int check_admins(struct config *c)
{
	uint32_t euid = (uint32_t)geteuid();

	if (c->admin_uids.set)
		return 0;
	c->admin_uids.v = calloc(2, sizeof(uint32_t));
	if (!c->admin_uids.v)
		return usage_err("admin_uids", "out of memory");
	c->admin_uids.v[c->admin_uids.n++] = 0;
	if (euid)
		c->admin_uids.v[c->admin_uids.n++] = euid;
	return 0;
}

/*
 * The disk tier: a directory kvpoold can write, a size, and a host tier
 * (pages come back from disk through it). Checked here so a bad one stops
 * kvpoold before it starts anything, with what to do.
 */
static int check_disk(struct config *c)
{
	struct stat sb;

	if (!c->disk_dir) {
		if (c->disk_size)
			return usage_err("disk_size", "%" PRIu64 " bytes but no "
					 "disk_dir; set disk_dir to enable the "
					 "disk tier", c->disk_size);
		return 0;
	}
	if (make_absolute(&c->disk_dir))
		return EXIT_USAGE;
	if (access(c->disk_dir, F_OK))
		return usage_err("disk_dir", "%s: %s; create it (mkdir -p %s, owned "
				 "by kvpoold's user) or set disk_dir to an existing "
				 "directory", c->disk_dir, strerror(errno),
				 c->disk_dir);
	if (stat(c->disk_dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
		return usage_err("disk_dir", "%s is not a directory; set disk_dir to "
				 "a directory kvpoold may write", c->disk_dir);
	if (access(c->disk_dir, W_OK | X_OK))
		return usage_err("disk_dir", "%s is not writable by uid %u (%s); "
				 "chown it to kvpoold's user or choose another "
				 "disk_dir", c->disk_dir, (unsigned)geteuid(),
				 strerror(errno));
	if (c->disk_size < c->layout.page_bytes + 4096)
		return usage_err("disk_size", "%" PRIu64 " bytes holds no page of "
				 "the layout (%" PRIu64 " bytes and a 4K header); "
				 "set disk_size, e.g. 64G", c->disk_size,
				 c->layout.page_bytes);
	if (!c->host_mem)
		return usage_err("disk_dir", "the disk tier needs a host tier "
				 "(pages go to disk from it and come back through "
				 "it); set host_mem");
	return 0;
}

/* tp: whole pools of devices, whole heads per rank. */
static int check_tp(const struct config *c)
{
	char devs[DEVICES_MAX * 6];

	if (c->tp <= 1)
		return 0;
	config_devices_format(c, devs, sizeof(devs));
	/* devices = all is counted when the backend opens (devices.c) */
	if (!c->devices_all && c->ndevices % c->tp)
		return usage_err("tp", "tp = %" PRIu32 " takes the devices %" PRIu32
				 " at a time (one pool per %" PRIu32 " GPUs) but "
				 "devices = %s lists %" PRIu32 "; list a multiple of %"
				 PRIu32 " devices or change tp", c->tp, c->tp, c->tp,
				 devs, c->ndevices, c->tp);
	if (c->layout.kv_heads % c->tp)
		return usage_err("tp", "tp = %" PRIu32 " splits each page's kv_heads "
				 "among %" PRIu32 " ranks but layout has kv_heads=%"
				 PRIu32 "; use a tp that divides kv_heads (layout is "
				 "the whole model's)", c->tp, c->tp, c->layout.kv_heads);
	return 0;
}

uint32_t config_npools(const struct config *c)
{
	return c->tp > 1 ? c->ndevices / c->tp : c->ndevices;
}

static int config_check(struct config *c)
{
	const size_t sun_max = sizeof(((struct sockaddr_un *)0)->sun_path);
	char err[KVP_ERRLEN];
	int ret;

	if (kvp_layout_parse(&c->layout, c->layout_spec, err, sizeof(err)))
		return usage_err("layout", "'%s': %s", c->layout_spec, err);
	ret = check_tp(c);
	ret = ret ? ret : make_absolute(&c->socket);
	ret = ret ? ret : make_absolute(&c->pidfile);
	ret = ret ? ret : make_absolute(&c->log);
	if (ret)
		return ret;
	if (strlen(c->socket) >= sun_max)
		return usage_err("socket", "'%s' is %zu bytes; a Unix socket path "
				 "must be shorter than %zu", c->socket,
				 strlen(c->socket), sun_max);
	ret = check_mem(c, "device_mem", "device_mem", c->device_mem, 1, INT32_MAX);
	ret = ret ? ret : check_mem(c, "host_mem", "host_mem", c->host_mem, 0,
				    UINT32_MAX - 1);
	ret = ret ? ret : check_max_tokens(c, "max_tokens_per_user",
					   c->max_tokens_per_user);
	if (!ret && c->ntenants > TENANTS_MAX)
		ret = usage_err("tenant", "%u tenants; at most %d", c->ntenants,
				TENANTS_MAX);
	ret = ret ? ret : check_disk(c);
	for (uint32_t i = 0; !ret && i < c->ntenants; i++)
		ret = check_tenant(c, i);
	return ret ? ret : check_admins(c);
}

/*
 * Pools are memory taken on first touch: a device_mem larger than the
 * machine starts fine and dies (SIGBUS, the OOM killer) once the pages are
 * used. Said at start, as a warning (an operator may mean to add memory).
 */
void config_warn_memory(const struct config *c)
{
	bool dev_in_ram = !c->backend || strcmp(c->backend, "cuda");
	long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
	uint64_t ram, want = c->host_mem + (dev_in_ram ? c->device_mem : 0);

	if (pages <= 0 || psz <= 0)
		return;
	ram = (uint64_t)pages * (uint64_t)psz;
	for (uint32_t i = 0; i < c->ntenants; i++)
		want += c->tenants[i].host_mem +
			(dev_in_ram ? c->tenants[i].device_mem : 0);
	if (want > ram)
		log_warn("the pools take %.1f GiB of memory (%s over every tenant) "
			 "and this machine has %.1f GiB: their pages are taken when "
			 "first used, so kvpoold or its clients will be killed once "
			 "they fill; lower %shost_mem", (double)want / (1u << 30),
			 dev_in_ram ? "device_mem + host_mem: on the shm backend the "
			 "device tier is memory too," : "host_mem",
			 (double)ram / (1u << 30), dev_in_ram ? "device_mem or " : "");
}

static int config_defaults(struct config *c)
{
	const char *env = getenv("KVPOOL_SOCKET");

	*c = (struct config){
		.socket_mode = 0660,
		.socket_gid = -1,
		.device_mem = DEFAULT_DEVICE_MEM,
		.host_mem = DEFAULT_HOST_MEM,
		.spin_us = 50,
		.workers = 1,
		.reclaim = RECLAIM_AUTO,
		.sq_entries = 256,
		.arena_bytes = 4u << 20,
		.max_pending = 256,
		.max_pending_per_uid = 64,
		.hello_timeout_ms = 5000,
		.remote_timeout_ms = 500,
		/* Queries are unique per request: each would cost a store
		 * round at registration and a write nobody reads. */
		.remote_chunk_types = 1u << KVP_CHUNK_SYSTEM | 1u << KVP_CHUNK_CONTEXT,
		.log_level = LOG_INFO,
		.chunk_memory_ratio = 1.0,
		.chunk_content_max = 1u << 20,
		.devices = { 0 },
		.ndevices = 1,
		.tp = 1,
	};
	if (set_str(&c->socket, env && *env ? env : KVP_DEFAULT_SOCKET) ||
	    set_str(&c->backend, KVPOOL_HAVE_CUDA ? "auto" : "shm") ||
	    set_str(&c->layout_spec, DEFAULT_LAYOUT))
		return usage_err("kvpoold", "out of memory");
	return 0;
}

int config_load(struct config *c, int argc, char **argv)
{
	int ret = config_defaults(c);

	ret = ret ? ret : parse_flags(c, argc, argv, 0);
	if (!ret && c->config_path)
		ret = load_file(c, c->config_path);
	ret = ret ? ret : parse_flags(c, argc, argv, 1);
	return ret ? ret : config_check(c);
}

void config_free(struct config *c)
{
	for (uint32_t i = 0; i < c->ntenants; i++) {
		id_list_free(&c->tenants[i].uids);
		id_list_free(&c->tenants[i].gids);
	}
	free(c->tenants);
	id_list_free(&c->allow_uids);
	id_list_free(&c->allow_gids);
	id_list_free(&c->admin_uids);
	free(c->config_path);
	free(c->socket);
	free(c->backend);
	free(c->layout_spec);
	free(c->pidfile);
	free(c->log);
	free(c->disk_dir);
	free(c->disk_compress);
	free(c->remote);
	free(c->remote_compress);
	free(c->metrics);
	*c = (struct config){ 0 };
}
