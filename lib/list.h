/* SPDX-License-Identifier: MIT */
/*
 * list.h - the one intrusive doubly linked list (the kernel's list.h, cut
 * down to what kvpool uses).
 *
 * A list is a struct list_head that is its own sentinel: empty when it
 * points at itself. An element embeds a struct list_head and is found
 * from it with list_entry() (container_of). Nothing here allocates, so
 * linking and unlinking cannot fail. A node that is on no list is kept
 * self-linked (INIT_LIST_HEAD, list_del_init), so list_empty(node) says
 * whether it is linked: list_del() leaves it so too.
 */
#ifndef KVPOOL_LIB_LIST_H
#define KVPOOL_LIB_LIST_H

#include <stdbool.h>
#include <stddef.h>

#ifndef container_of
#define container_of(ptr, type, member) \
	((type *)(void *)((char *)(ptr) - offsetof(type, member)))
#endif

struct list_head {
	struct list_head *next, *prev;
};

#define LIST_HEAD_INIT(name) { &(name), &(name) }

static inline void INIT_LIST_HEAD(struct list_head *l)
{
	l->next = l;
	l->prev = l;
}

static inline bool list_empty(const struct list_head *l)
{
	return l->next == l;
}

static inline void __list_add(struct list_head *n, struct list_head *prev,
			      struct list_head *next)
{
	next->prev = n;
	n->next = next;
	n->prev = prev;
	prev->next = n;
}

/* n first in the list (a stack's push). */
static inline void list_add(struct list_head *n, struct list_head *head)
{
	__list_add(n, head, head->next);
}

/* n last in the list (a queue's push; an LRU's most recent). */
static inline void list_add_tail(struct list_head *n, struct list_head *head)
{
	__list_add(n, head->prev, head);
}

/* Unlink n; it is left self-linked (list_empty(n) is then true). */
static inline void list_del(struct list_head *n)
{
	n->next->prev = n->prev;
	n->prev->next = n->next;
	INIT_LIST_HEAD(n);
}

#define list_entry(ptr, type, member) container_of(ptr, type, member)

#define list_first_entry(head, type, member) \
	list_entry((head)->next, type, member)

#define list_first_entry_or_null(head, type, member) \
	(list_empty(head) ? NULL : list_first_entry(head, type, member))

#define list_next_entry(pos, member) \
	list_entry((pos)->member.next, __typeof__(*(pos)), member)

/* The entry after pos, NULL when pos is the last of the list at head. */
#define list_next_entry_or_null(pos, head, member) \
	((pos)->member.next == (head) ? NULL : list_next_entry(pos, member))

#define list_entry_is_head(pos, head, member) (&(pos)->member == (head))

#define list_for_each_entry(pos, head, member)                              \
	for (pos = list_first_entry(head, __typeof__(*(pos)), member);      \
	     !list_entry_is_head(pos, head, member);                        \
	     pos = list_next_entry(pos, member))

/* As list_for_each_entry, but pos may be unlinked (and freed) in the body. */
#define list_for_each_entry_safe(pos, n, head, member)                      \
	for (pos = list_first_entry(head, __typeof__(*(pos)), member),      \
	     n = list_next_entry(pos, member);                              \
	     !list_entry_is_head(pos, head, member);                        \
	     pos = n, n = list_next_entry(n, member))

#endif /* KVPOOL_LIB_LIST_H */
