/* SPDX-License-Identifier: MIT */
/*
 * hstu_csv.c - the HSTU example's CSV files into a trace (hstu_csv.h).
 *
 * A small CSV reader of our own: pandas writes plain RFC 4180 (fields
 * quoted when they hold a comma, "" for a quote inside), one record per
 * line; the list columns are the only quoted ones in these files.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hstu_csv.h"

#define MAX_FIELDS 256

struct csv {
	FILE *f;
	const char *name;
	char *line;
	size_t cap;
	size_t lineno;
	char *field[MAX_FIELDS];
	int nfields;
};

/* Split the next record into fields, in place. 1 a record, 0 end, -1 error. */
static int csv_next(struct csv *c, char *err, size_t errlen)
{
	ssize_t len;
	char *p, *w;

	do {
		len = getline(&c->line, &c->cap, c->f);
		if (len < 0)
			return 0;
		c->lineno++;
		while (len && (c->line[len - 1] == '\n' || c->line[len - 1] == '\r'))
			c->line[--len] = '\0';
	} while (!len);
	c->nfields = 0;
	p = c->line;
	for (;;) {
		if (c->nfields == MAX_FIELDS) {
			snprintf(err, errlen, "%s:%zu: more than %d columns", c->name, c->lineno,
				 MAX_FIELDS);
			return -1;
		}
		c->field[c->nfields++] = w = p;
		if (*p == '"') {
			p++;
			for (;;) {
				if (!*p) {
					snprintf(err, errlen, "%s:%zu: a quoted field is not closed "
						 "(one record per line expected)", c->name, c->lineno);
					return -1;
				}
				if (*p == '"' && p[1] == '"') {
					*w++ = '"';
					p += 2;
				} else if (*p == '"') {
					p++;
					break;
				} else {
					*w++ = *p++;
				}
			}
			if (*p && *p != ',') {
				snprintf(err, errlen, "%s:%zu: text after a closing quote in column "
					 "%d", c->name, c->lineno, c->nfields);
				return -1;
			}
		} else {
			while (*p && *p != ',')
				*w++ = *p++;
		}
		if (!*p) {
			*w = '\0';
			return 1;
		}
		*w = '\0';
		p++;
	}
}

static int col(const struct csv *c, const char *name, char *err, size_t errlen)
{
	for (int i = 0; i < c->nfields; i++)
		if (!strcmp(c->field[i], name))
			return i;
	snprintf(err, errlen, "%s: the header has no '%s' column; is this the HSTU "
		 "example's %s?", c->name, name, strstr(c->name, "batches") ?
		 HSTU_BATCHES_CSV : HSTU_SEQS_CSV);
	return -1;
}

/* An integer cell; pandas may write "5.0" for an int column with gaps. */
static int cell_int(const struct csv *c, int i, const char *what, long long min,
		    long long max, long long *out, char *err, size_t errlen)
{
	const char *s = i < c->nfields ? c->field[i] : "";
	char *end;

	errno = 0;
	*out = strtoll(s, &end, 10);
	if (end != s && end[0] == '.' && end[1] == '0' && !end[2])
		end += 2;
	if (end == s || *end || errno || *out < min || *out > max) {
		snprintf(err, errlen, "%s:%zu: column %s: '%s' is not an integer in [%lld, %lld]",
			 c->name, c->lineno, what, s, min, max);
		return -1;
	}
	return 0;
}

/*
 * A Python-list cell "[a, b, c]" into a freshly allocated array (*n
 * elements; *out NULL when empty).
 */
static int cell_list(const struct csv *c, int i, const char *what, long long **out,
		     size_t *n, char *err, size_t errlen)
{
	const char *s = i < c->nfields ? c->field[i] : "", *p = s;
	long long *v = NULL;
	size_t cap = 0;
	char *end;

	*out = NULL;
	*n = 0;
	while (*p == ' ')
		p++;
	if (*p++ != '[')
		goto bad;
	for (;;) {
		while (*p == ' ')
			p++;
		if (*p == ']' && !*n)
			break;
		errno = 0;
		if (*n == cap) {
			long long *q = realloc(v, (cap = cap ? 2 * cap : 64) * sizeof(*v));

			if (!q) {
				free(v);
				snprintf(err, errlen, "%s:%zu: out of memory", c->name, c->lineno);
				return -1;
			}
			v = q;
		}
		v[*n] = strtoll(p, &end, 10);
		if (end == p || errno)
			goto bad;
		if (end[0] == '.' && end[1] == '0')
			end += 2;
		(*n)++;
		p = end;
		while (*p == ' ')
			p++;
		if (*p == ']')
			break;
		if (*p++ != ',')
			goto bad;
	}
	p++;
	while (*p == ' ')
		p++;
	if (*p)
		goto bad;
	*out = v;
	return 0;
bad:
	free(v);
	snprintf(err, errlen, "%s:%zu: column %s: '%.60s%s' is not a list of integers "
		 "like [1, 2, 3]", c->name, c->lineno, what, s, strlen(s) > 60 ? "..." : "");
	return -1;
}

/* (user, date) -> the day's event count, sorted for bsearch. */
struct day_len {
	uint64_t key;
	uint32_t n;
};

static int cmp_day(const void *a, const void *b)
{
	uint64_t x = ((const struct day_len *)a)->key, y = ((const struct day_len *)b)->key;

	return x < y ? -1 : x > y;
}

static int open_csv(struct csv *c, const char *path, char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	c->name = path;
	c->f = fopen(path, "r");
	if (!c->f) {
		int rc = -errno;

		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return rc;
	}
	if (csv_next(c, err, errlen) != 1) {
		if (!err[0])
			snprintf(err, errlen, "%s: empty file; expected a header line", path);
		return -EINVAL;
	}
	return 0;
}

static void close_csv(struct csv *c)
{
	if (c->f)
		fclose(c->f);
	free(c->line);
}

/* The seqs file: day lengths into *days, and requests into t when want_reqs. */
static int load_seqs(struct trace *t, const char *path, bool want_reqs,
		     struct day_len **days, size_t *ndays, char *err, size_t errlen)
{
	struct csv c;
	int cu, cd, cv, ct, ci, rc;
	long long user, date, *vid = NULL, *tms = NULL, *ptr = NULL;
	size_t nv, nt, np, cap = 0;

	*days = NULL;
	*ndays = 0;
	rc = open_csv(&c, path, err, errlen);
	if (rc)
		goto out;
	rc = -EINVAL;
	if ((cu = col(&c, "user_id", err, errlen)) < 0 || (cd = col(&c, "date", err, errlen)) < 0 ||
	    (cv = col(&c, "video_id", err, errlen)) < 0 ||
	    (ct = col(&c, "time_ms", err, errlen)) < 0 ||
	    (ci = col(&c, "interval_indptr", err, errlen)) < 0)
		goto out;
	while ((rc = csv_next(&c, err, errlen)) == 1) {
		rc = -EINVAL;
		if (cell_int(&c, cu, "user_id", 0, TRACE_MAX_USER, &user, err, errlen) ||
		    cell_int(&c, cd, "date", 19700101, 99991231, &date, err, errlen) ||
		    cell_list(&c, cv, "video_id", &vid, &nv, err, errlen) ||
		    cell_list(&c, ct, "time_ms", &tms, &nt, err, errlen) ||
		    cell_list(&c, ci, "interval_indptr", &ptr, &np, err, errlen))
			goto out;
		if (nt != nv || np < 1 || ptr[0] != 0 || ptr[np - 1] != (long long)nv) {
			snprintf(err, errlen, "%s:%zu: user %lld on %lld: %zu video_id, %zu time_ms; "
				 "interval_indptr must run from 0 to the list length", path, c.lineno,
				 user, date, nv, nt);
			goto out;
		}
		for (size_t j = 1; j < np; j++) {
			if (ptr[j] <= ptr[j - 1]) {
				snprintf(err, errlen, "%s:%zu: user %lld on %lld: interval_indptr is "
					 "not increasing at position %zu", path, c.lineno, user, date, j);
				goto out;
			}
			if (want_reqs && trace_push(t, (uint64_t)tms[ptr[j] - 1], (uint32_t)user,
						    (uint32_t)date, (uint32_t)ptr[j]))
				goto nomem;
		}
		if (*ndays == cap) {
			struct day_len *q = realloc(*days, (cap = cap ? 2 * cap : 1024) * sizeof(*q));

			if (!q)
				goto nomem;
			*days = q;
		}
		(*days)[(*ndays)++] = (struct day_len){ trace_key((uint32_t)user, (uint32_t)date),
							(uint32_t)nv };
		free(vid);
		free(tms);
		free(ptr);
		vid = tms = ptr = NULL;
	}
	if (rc < 0 && rc != -ENOMEM)
		rc = -EINVAL;
	if (rc == 0)
		qsort(*days, *ndays, sizeof(**days), cmp_day);
	goto out;
nomem:
	snprintf(err, errlen, "%s:%zu: out of memory", path, c.lineno);
	rc = -ENOMEM;
out:
	free(vid);
	free(tms);
	free(ptr);
	close_csv(&c);
	return rc;
}

static int load_batches(struct trace *t, const char *path, const struct day_len *days,
			size_t ndays, char *err, size_t errlen)
{
	struct csv c;
	long long user, date, ts, end;
	int cu, cd, ct, ci, rc;

	rc = open_csv(&c, path, err, errlen);
	if (rc)
		goto out;
	rc = -EINVAL;
	if ((cu = col(&c, "user_id", err, errlen)) < 0 || (cd = col(&c, "date", err, errlen)) < 0 ||
	    (ct = col(&c, "interval_end_ts", err, errlen)) < 0 ||
	    (ci = col(&c, "interval_indptr", err, errlen)) < 0)
		goto out;
	while ((rc = csv_next(&c, err, errlen)) == 1) {
		rc = -EINVAL;
		if (cell_int(&c, cu, "user_id", 0, TRACE_MAX_USER, &user, err, errlen) ||
		    cell_int(&c, cd, "date", 19700101, 99991231, &date, err, errlen) ||
		    cell_int(&c, ct, "interval_end_ts", 0, LLONG_MAX, &ts, err, errlen) ||
		    cell_int(&c, ci, "interval_indptr", 1, UINT32_MAX, &end, err, errlen))
			goto out;
		if (days) {
			struct day_len k = { trace_key((uint32_t)user, (uint32_t)date), 0 };
			const struct day_len *d = bsearch(&k, days, ndays, sizeof(k), cmp_day);

			if (!d || end > d->n) {
				snprintf(err, errlen, "%s:%zu: user %lld on %lld ends at item %lld, but %s",
					 path, c.lineno, user, date, end, d ? "the seqs file has fewer "
					 "items that day" : "the seqs file has no row for that day");
				goto out;
			}
		}
		if (trace_push(t, (uint64_t)ts, (uint32_t)user, (uint32_t)date, (uint32_t)end)) {
			snprintf(err, errlen, "%s:%zu: out of memory", path, c.lineno);
			rc = -ENOMEM;
			goto out;
		}
	}
	if (rc < 0)
		rc = -EINVAL;
out:
	close_csv(&c);
	return rc;
}

int hstu_load(struct trace *t, const char *seqs_path, const char *batches_path,
	      char *err, size_t errlen)
{
	struct day_len *days = NULL;
	size_t ndays = 0;
	int rc = 0;

	memset(t, 0, sizeof(*t));
	err[0] = '\0';
	if (!seqs_path && !batches_path) {
		snprintf(err, errlen, "no HSTU file given: name %s, %s or both",
			 HSTU_SEQS_CSV, HSTU_BATCHES_CSV);
		return -EINVAL;
	}
	if (seqs_path)
		rc = load_seqs(t, seqs_path, !batches_path, &days, &ndays, err, errlen);
	if (!rc && batches_path)
		rc = load_batches(t, batches_path, days, ndays, err, errlen);
	if (!rc && !t->n) {
		snprintf(err, errlen, "%s: no requests (no data rows)",
			 batches_path ? batches_path : seqs_path);
		rc = -EINVAL;
	}
	if (!rc)
		rc = trace_finish(t, err, errlen);
	free(days);
	if (rc)
		trace_free(t);
	return rc;
}

int hstu_load_dir(struct trace *t, const char *dir, char *err, size_t errlen)
{
	char seqs[4096], batches[4096];
	bool have_s, have_b;

	snprintf(seqs, sizeof(seqs), "%s/%s", dir, HSTU_SEQS_CSV);
	snprintf(batches, sizeof(batches), "%s/%s", dir, HSTU_BATCHES_CSV);
	have_s = access(seqs, R_OK) == 0;
	have_b = access(batches, R_OK) == 0;
	if (!have_s && !have_b) {
		memset(t, 0, sizeof(*t));
		snprintf(err, errlen, "%s: neither %s nor %s is there (or readable)", dir,
			 HSTU_SEQS_CSV, HSTU_BATCHES_CSV);
		return -ENOENT;
	}
	return hstu_load(t, have_s ? seqs : NULL, have_b ? batches : NULL, err, errlen);
}
