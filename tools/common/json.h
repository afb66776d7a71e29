/* SPDX-License-Identifier: MIT */
/*
 * json.h - the streaming JSON writer kvctl and kvbench print with.
 *
 * It writes one pretty-printed object (two-space indent) member by member,
 * straight to a FILE, with no allocation. Strings are always valid JSON,
 * whatever bytes they hold: a client's name or a command line can carry
 * control characters or invalid UTF-8.
 *
 * Why this is not libjansson (which kvpoold uses to parse and match chunk
 * metadata): jansson's integers are json_int_t (long long), and what kvctl
 * and kvbench print is uint64_t: user ids, counters and byte counts take
 * every value up to 2^64-1, and json_integer((json_int_t)UINT64_MAX) is
 * written as -1 (checked against Debian's 2.14). A real loses the digits
 * past 2^53 instead. The writer also keeps the fixed decimals the output
 * promises ("0.2500") and writes as it goes, where jansson builds a tree
 * of every row of a listing first. What is left by hand is the easy part
 * of JSON (braces, commas, numbers); the hard part, strings, is tested
 * byte by byte (test_kvctl_output: escapes, valid and invalid UTF-8).
 */
#ifndef KVPOOL_TOOLS_JSON_H
#define KVPOOL_TOOLS_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define JSON_MAX_DEPTH 16

/*
 * A writer of one object. key is NULL for an element of an array. Nesting
 * deeper than JSON_MAX_DEPTH is a programming error and aborts.
 */
struct json {
	FILE *f;
	int depth;
	bool first[JSON_MAX_DEPTH];
};

void json_begin(struct json *j, FILE *f);  /* opens the top-level object */
void json_end(struct json *j);             /* closes it, adds a newline */
void json_obj_begin(struct json *j, const char *key);
void json_obj_end(struct json *j);
void json_arr_begin(struct json *j, const char *key);
void json_arr_end(struct json *j);
void json_u64(struct json *j, const char *key, uint64_t v);
void json_i64(struct json *j, const char *key, int64_t v);
/* v with the given digits after the point ("%.*f"); a non-finite v is null. */
void json_f64(struct json *j, const char *key, double v, int decimals);
void json_bool(struct json *j, const char *key, bool v);
void json_null(struct json *j, const char *key);
/* A NUL-terminated string; NULL is written as null. */
void json_str(struct json *j, const char *key, const char *v);
/* At most len bytes of s, stopping early at a NUL (fixed-size name fields). */
void json_strn(struct json *j, const char *key, const char *s, size_t len);

/*
 * Write s[0, len) as a quoted JSON string: '"', '\\' and control characters
 * escaped, valid UTF-8 copied, every byte of an invalid UTF-8 sequence
 * written as \ufffd, so the output is valid JSON whatever the bytes were.
 */
void json_write_string(FILE *f, const char *s, size_t len);

#endif /* KVPOOL_TOOLS_JSON_H */
