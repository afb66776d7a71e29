/* SPDX-License-Identifier: MIT */
/*
 * trace_io.c - the kvtrace 1 file format (trace.h describes it): writing a
 * trace, with its events where it was generated, and reading one back with
 * every line checked.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"

int trace_write(const struct trace *t, FILE *f)
{
	fprintf(f, "# kvtrace 1\n");
	if (t->gen_users)
		fprintf(f, "# users=%u days=%u seed=%llu first_date=%u\n", t->gen_users,
			t->gen_days, (unsigned long long)t->seed, t->first_date);
	fprintf(f, "# date ts_ms user end [item:action ...]; see kvbench(1), TRACE FORMAT\n");
	for (size_t i = 0; i < t->n; i++) {
		const struct trace_req *r = &t->req[i];

		fprintf(f, "%u %llu %u %u", r->date, (unsigned long long)r->ts_ms, r->user,
			r->end);
		if (t->gen_users) {
			for (uint32_t k = r->begin; k < r->end; k++) {
				uint32_t item, action;

				trace_event(t->seed, r->user, r->date, k, &item, &action);
				fprintf(f, " %u:%u", item, action);
			}
		}
		fputc('\n', f);
	}
	fflush(f);
	return ferror(f) ? -EIO : 0;
}

/* One unsigned decimal field at *p, then a space or the end of the line. */
static int field(char **p, unsigned long long max, unsigned long long *out)
{
	char *end;

	if (**p < '0' || **p > '9')
		return -1;
	errno = 0;
	*out = strtoull(*p, &end, 10);
	if (errno || *out > max || (*end != ' ' && *end != '\0' && *end != ':'))
		return -1;
	*p = end;
	return 0;
}

/* Count the item:action pairs after the four fields; -1 if malformed. */
static long count_events(char *p)
{
	unsigned long long v;
	long n = 0;

	while (*p == ' ') {
		p++;
		if (field(&p, UINT32_MAX, &v) || *p != ':')
			return -1;
		p++;
		if (field(&p, 255, &v) || *p == ':')
			return -1;
		n++;
	}
	return *p ? -1 : n;
}

int trace_read(struct trace *t, FILE *f, const char *name, char *err,
	       size_t errlen)
{
	unsigned long long date, ts, user, end;
	char *line = NULL, *p;
	size_t cap = 0, lineno = 0;
	ssize_t len;
	long *events = NULL;
	size_t nev = 0, evcap = 0;
	int rc = 0;

	memset(t, 0, sizeof(*t));
	while ((len = getline(&line, &cap, f)) >= 0) {
		lineno++;
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (lineno == 1) {
			if (strcmp(line, "# kvtrace 1")) {
				snprintf(err, errlen, "%s: not a kvtrace 1 file (its first line "
					 "must be '# kvtrace 1'); write one with 'kvbench trace -o FILE'",
					 name);
				rc = -EINVAL;
				goto out;
			}
			continue;
		}
		if (line[0] == '#' || !line[0])
			continue;
		p = line;
		if (field(&p, 99991231, &date) || *p++ != ' ' ||
		    field(&p, UINT64_MAX, &ts) || *p++ != ' ' ||
		    field(&p, TRACE_MAX_USER, &user) || *p++ != ' ' ||
		    field(&p, UINT32_MAX, &end) || (*p != ' ' && *p)) {
			snprintf(err, errlen, "%s:%zu: expected 'date ts_ms user end "
				 "[item:action ...]' (decimal, user < 2^24)", name, lineno);
			rc = -EINVAL;
			goto out;
		}
		if (nev == evcap) {
			long *q = realloc(events, (evcap = evcap ? 2 * evcap : 4096) * sizeof(*q));

			if (!q)
				goto nomem;
			events = q;
		}
		events[nev] = count_events(p);
		if (events[nev] < 0) {
			snprintf(err, errlen, "%s:%zu: events must be 'item:action' pairs "
				 "(action a bitmask < 256) separated by one space", name, lineno);
			rc = -EINVAL;
			goto out;
		}
		if (trace_push(t, ts, (uint32_t)user, (uint32_t)date, (uint32_t)end))
			goto nomem;
		/* Where this request landed before sorting: its line, for the check. */
		t->req[t->n - 1].pad = (uint32_t)nev++;
	}
	if (ferror(f)) {
		rc = -errno ? -errno : -EIO;
		snprintf(err, errlen, "%s: read error: %s", name, strerror(-rc));
		goto out;
	}
	if (!t->n) {
		snprintf(err, errlen, "%s: no requests in the trace", name);
		rc = -EINVAL;
		goto out;
	}
	rc = trace_finish(t, err, errlen);
	if (rc)
		goto out;
	for (size_t i = 0; i < t->n; i++) {
		const struct trace_req *r = &t->req[i];
		long n = events[r->pad];

		if (n && n != (long)(r->end - r->begin)) {
			snprintf(err, errlen, "%s: user %u on %u at ts_ms %llu: %ld events listed, "
				 "but end %u - previous end %u = %u", name, r->user, r->date,
				 (unsigned long long)r->ts_ms, n, r->end, r->begin, r->end - r->begin);
			rc = -EINVAL;
			goto out;
		}
	}
	goto out;
nomem:
	snprintf(err, errlen, "%s: out of memory at line %zu", name, lineno);
	rc = -ENOMEM;
out:
	if (rc)
		trace_free(t);
	free(line);
	free(events);
	return rc;
}
