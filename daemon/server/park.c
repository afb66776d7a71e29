/* SPDX-License-Identifier: MIT */
/*
 * park.c - completions parked until an onload lands (see park.h).
 */
#include <errno.h>
#include <stdlib.h>

#include "park.h"

int park_init(struct park_list *p, uint32_t cap)
{
	p->v = calloc(cap, sizeof(*p->v));
	p->n = 0;
	p->cap = p->v ? cap : 0;
	return p->v ? 0 : -ENOMEM;
}

void park_fini(struct park_list *p)
{
	free(p->v);
	*p = (struct park_list){ 0 };
}

bool park_add(struct park_list *p, const struct park *e)
{
	if (p->n >= p->cap)
		return false;
	p->v[p->n++] = *e;
	return true;
}

bool park_has_user(const struct park_list *p, uint64_t user)
{
	for (uint32_t i = 0; i < p->n; i++)
		if (p->v[i].user == user)
			return true;
	return false;
}

uint32_t park_reap(struct park_list *p, uint32_t max, park_landed_fn landed,
		   park_emit_fn emit, void *arg)
{
	uint32_t kept = 0, done = 0;

	for (uint32_t i = 0; i < p->n; i++) {
		if (done < max && landed(arg, &p->v[i])) {
			emit(arg, &p->v[i].cqe);
			done++;
			continue;
		}
		if (kept != i)
			p->v[kept] = p->v[i];
		kept++;
	}
	p->n = kept;
	return done;
}
