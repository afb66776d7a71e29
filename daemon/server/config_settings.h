/* SPDX-License-Identifier: MIT */
/*
 * config_settings.h - the settings table (config_settings.c), shared with
 * config.c, which reads kvpool.conf and the flags through it.
 */
#ifndef KVPOOLD_CONFIG_SETTINGS_H
#define KVPOOLD_CONFIG_SETTINGS_H

#include <stddef.h>

#include "config.h"

#ifndef KVPOOL_HAVE_CUDA
#define KVPOOL_HAVE_CUDA 0
#endif

#define DEFAULT_LAYOUT "layers=2,kv_heads=2,head_dim=64,dtype=bf16,page_tokens=16"
#define DEFAULT_DEVICE_MEM (256ull << 20)
#define DEFAULT_HOST_MEM (1ull << 30)
#define WORKERS_MAX 64

#define G (1u << 0) /* valid as a global setting */
#define T (1u << 1) /* valid in a [tenant NAME] section */
#define B (1u << 2) /* boolean: a bare --key means yes */
#define S (1u << 3) /* a secret: never repeated in a message */

typedef int (*setter)(struct config *c, struct tenant_config *t,
		      const char *v, char *err, size_t len);

struct setting {
	const char *key;
	unsigned scope;
	setter set;
	const char *arg;
	const char *help;
};

extern const struct setting settings[];
extern const size_t nsettings;

/* The setting named key, NULL when there is none. */
const struct setting *setting_find(const char *key);
/* *dst = a copy of v (the old one freed); -ENOMEM. */
int set_str(char **dst, const char *v);

#endif /* KVPOOLD_CONFIG_SETTINGS_H */
