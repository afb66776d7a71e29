/* SPDX-License-Identifier: MIT */
/*
 * gpu_report.c - `kvbench gpu`'s options and report: the command line into
 * struct gpu_opts, and the results as a table or as one JSON object. The
 * measurements are in bench_gpu.c, built only with CUDA; without it the
 * subcommand still parses its options (so --help works) and then says that
 * kvbench was built without CUDA.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu_report.h"
#include "kvbench.h"
#include "kvpool.h"

#define SUB "gpu"

const uint32_t gpu_lat_users[GPU_LAT_BATCHES] = { 1, 8, 64, 512 };

/* ---------------------------------------------------------------- options */

static void usage(FILE *f)
{
	fprintf(f,
"Usage: kvbench gpu [options]\n"
"\n"
"Measure the data path on one GPU, each figure next to a ceiling measured in\n"
"the same run: the append kernel (kvp_append_cuda, kvp_append_layers_cuda)\n"
"against a device-to-device cudaMemcpy of the same bytes, for --layout and\n"
"for 512-byte rows; offload and onload through the engine on the cuda\n"
"backend against raw pinned cudaMemcpyAsync; the latency of a batched\n"
"one-token append for 1, 8, 64 and 512 users per launch.\n"
"\n"
"Options:\n"
"  --layout SPEC      layout of the append, offload/onload and latency parts\n"
"                     (default " GPU_DEFAULT_LAYOUT ")\n"
"  --mib N            the append pool, and the bytes offloaded and onloaded,\n"
"                     in MiB (default 1024)\n"
"  --device N         CUDA device ordinal (default 0)\n"
"  --reps N           repetitions of each bandwidth figure; the median counts\n"
"                     (default 10)\n"
"  --samples N        latency samples per batch size (default 2000)\n"
KVB_USAGE_END_OPTS
"\n"
"Bandwidth counts bytes read plus bytes written for the append and its d2d\n"
"ceiling, bytes moved once for offload and onload. See kvbench(1).\n");
}

enum { OPT_LAYOUT = 256, OPT_MIB, OPT_DEVICE, OPT_REPS, OPT_SAMPLES };

static const struct option long_opts[] = {
	{ "layout", required_argument, NULL, OPT_LAYOUT },
	{ "mib", required_argument, NULL, OPT_MIB },
	{ "device", required_argument, NULL, OPT_DEVICE },
	{ "reps", required_argument, NULL, OPT_REPS },
	{ "samples", required_argument, NULL, OPT_SAMPLES },
	KVB_LONG_OPTS_END,
};

static int one_opt(void *ctx, int c, const char *arg)
{
	struct gpu_opts *o = ctx;
	char err[KVP_ERRLEN] = "";

	switch (c) {
	case OPT_LAYOUT:
		if (kvp_layout_parse(&o->layout, arg, err, sizeof(err)) < 0)
			return kvb_usage_error(SUB, "--layout: %s", err[0] ? err : "bad layout");
		return -1;
	case OPT_MIB:
		return kvb_opt_count(SUB, "--mib", arg, 1, 1u << 20, &o->mib);
	case OPT_DEVICE:
		return kvb_opt_count(SUB, "--device", arg, 0, 1023, &o->device);
	case OPT_REPS:
		return kvb_opt_count(SUB, "--reps", arg, 1, 1000, &o->reps);
	case OPT_SAMPLES:
		return kvb_opt_count(SUB, "--samples", arg, 1, 1000000, &o->samples);
	}
	return -1;
}

static uint64_t phys_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);

	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : UINT64_MAX;
}

/* Sizes that cannot work whatever the GPU (its memory is checked later). */
static int check_sizes(const struct gpu_opts *o)
{
	const struct kvp_layout *ls[2] = { &o->layout, &o->small };
	double phys_mib = (double)phys_bytes() / 1048576.0;

	for (int k = 0; k < 2; k++) {
		uint64_t pages = (o->mib << 20) / ls[k]->page_bytes;
		char spec[256];

		kvp_layout_format(ls[k], spec, sizeof(spec));
		if (pages == 0)
			return kvb_usage_error(SUB, "--mib %" PRIu64 " holds no page of %"
					       PRIu64 " B (%s); raise it", o->mib,
					       ls[k]->page_bytes, spec);
		if (pages * ls[k]->page_tokens > UINT32_MAX)
			return kvb_usage_error(SUB, "--mib %" PRIu64 ": more tokens of %s "
					       "than one append takes (2^32 - 1)",
					       o->mib, spec);
	}
	/* The read-back check holds the source and the pool in host memory,
	 * the host tier is as large. */
	if (2.0 * (double)o->mib > phys_mib * 0.75)
		return kvb_usage_error(SUB, "--mib %" PRIu64 " needs twice that in host "
				       "memory and this machine has %.0f MiB", o->mib,
				       phys_mib);
	return -1;
}

int gpu_parse_opts(int argc, char **argv, struct gpu_opts *o)
{
	char err[KVP_ERRLEN] = "";
	int rc;

	memset(o, 0, sizeof(*o));
	o->mib = 1024;
	o->reps = 10;
	o->samples = 2000;
	if (kvp_layout_parse(&o->layout, GPU_DEFAULT_LAYOUT, err, sizeof(err)) < 0 ||
	    kvp_layout_parse(&o->small, GPU_SMALL_ROWS_LAYOUT, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbench gpu: a built-in layout does not parse: %s\n", err);
		return KVB_EXIT_FAIL;
	}
	rc = kvb_parse_opts(SUB, argc, argv, long_opts, usage, one_opt, o, &o->json);
	if (rc >= 0)
		return rc;
	return check_sizes(o);
}

#ifndef KVPOOL_HAVE_CUDA

int cmd_gpu(int argc, char **argv)
{
	struct gpu_opts o;
	int rc = gpu_parse_opts(argc, argv, &o);

	if (rc >= 0)
		return rc;
	fprintf(stderr, "kvbench gpu: kvbench was built without CUDA; rebuild with "
		"-DKVPOOL_CUDA=ON on a machine with the CUDA toolkit\n");
	return KVB_EXIT_FAIL;
}

#else /* KVPOOL_HAVE_CUDA */

/* ---------------------------------------------------------------- report */

static double ratio(double a, double b)
{
	return b > 0 ? a / b : 0;
}

static void json_gbps_all(struct json *j, const char *key, const double *v,
			  uint64_t n)
{
	json_arr_begin(j, key);
	for (uint64_t i = 0; i < n; i++)
		json_f64(j, NULL, v[i], 1);
	json_arr_end(j);
}

/* The members of one append geometry. */
static void json_append_body(struct json *j, const struct gpu_opts *o,
			     const struct gpu_append *a)
{
	char spec[256];

	kvp_layout_format(&a->l, spec, sizeof(spec));
	json_f64(j, "gbps", a->gbps, 1);
	json_f64(j, "ratio_vs_d2d", ratio(a->gbps, a->d2d_gbps), 3);
	json_f64(j, "d2d_gbps", a->d2d_gbps, 1);
	json_f64(j, "layers_gbps", a->layers_gbps, 1);
	json_f64(j, "layers_ratio_vs_d2d", ratio(a->layers_gbps, a->d2d_gbps), 3);
	json_f64(j, "pages_shuffled_gbps", a->pages_gbps, 1);
	json_f64(j, "pages_shuffled_ratio_vs_d2d", ratio(a->pages_gbps, a->d2d_gbps), 3);
	json_str(j, "layout", spec);
	json_u64(j, "row_bytes", a->l.token_stride);
	json_u64(j, "token_bytes", a->l.token_bytes);
	json_u64(j, "tokens", a->tokens);
	json_u64(j, "pages", a->pages);
	json_u64(j, "bytes", a->bytes);
	json_str(j, "bytes_counted",
		 "read + written: 2 x tokens x token_bytes per append, 2 x the same "
		 "bytes per d2d cudaMemcpyAsync");
	json_str(j, "slots", "one launch writes every token slot of the pool, the "
		 "slots in a random order (gbps, layers_gbps); pages_shuffled: the "
		 "pages in a random order, each page's slots in order");
	json_bool(j, "verified", a->verified);
	json_bool(j, "layers_verified", a->layers_verified);
	json_u64(j, "reps", o->reps);
	json_gbps_all(j, "gbps_all", a->gbps_all, o->reps);
	json_gbps_all(j, "layers_gbps_all", a->layers_gbps_all, o->reps);
	json_gbps_all(j, "pages_shuffled_gbps_all", a->pages_gbps_all, o->reps);
	json_gbps_all(j, "d2d_gbps_all", a->d2d_gbps_all, o->reps);
}

static void json_lat_map(struct json *j, const char *key, const double *v)
{
	char k[16];

	json_obj_begin(j, key);
	for (int i = 0; i < GPU_LAT_BATCHES; i++) {
		snprintf(k, sizeof(k), "%" PRIu32, gpu_lat_users[i]);
		json_f64(j, k, v[i], 2);
	}
	json_obj_end(j);
}

void gpu_print_json(const struct gpu_opts *o, const struct gpu_results *r)
{
	const struct gpu_xfer *x = &r->xfer;
	char spec[256];
	struct json j;

	kvp_layout_format(&o->layout, spec, sizeof(spec));
	kvb_json_begin(&j, "gpu");

	json_obj_begin(&j, "append");
	json_append_body(&j, o, &r->append);
	json_obj_begin(&j, "small_rows");
	json_append_body(&j, o, &r->small);
	json_obj_end(&j);
	json_obj_end(&j);

	json_obj_begin(&j, "offload");
	json_f64(&j, "gbps", x->offload_gbps, 2);
	json_f64(&j, "ratio_vs_memcpy", ratio(x->offload_gbps, x->raw_d2h_gbps), 3);
	json_f64(&j, "memcpy_gbps", x->raw_d2h_gbps, 2);
	json_f64(&j, "memcpy_per_page_gbps", x->raw_d2h_page_gbps, 2);
	json_str(&j, "how", "engine_offload_all of every user's device pages to the "
		 "pinned host tier; ceiling: one cudaMemcpyAsync device to host of "
		 "the same bytes between the same tier buffers");
	json_gbps_all(&j, "gbps_all", x->offload_all, o->reps);
	json_obj_end(&j);

	json_obj_begin(&j, "onload");
	json_f64(&j, "gbps", x->onload_gbps, 2);
	json_f64(&j, "ratio_vs_memcpy", ratio(x->onload_gbps, x->raw_h2d_gbps), 3);
	json_f64(&j, "memcpy_gbps", x->raw_h2d_gbps, 2);
	json_f64(&j, "memcpy_per_page_gbps", x->raw_h2d_page_gbps, 2);
	json_str(&j, "how", "engine_evict_all(device), then a read-only "
		 "engine_prepare of every user, timed until the copies have landed; "
		 "ceiling: one cudaMemcpyAsync host to device of the same bytes "
		 "between the same tier buffers");
	json_gbps_all(&j, "gbps_all", x->onload_all, o->reps);
	json_obj_end(&j);

	json_obj_begin(&j, "bidirectional");
	json_f64(&j, "gbps", x->bidir_gbps, 2);
	json_f64(&j, "ratio_vs_memcpy", ratio(x->bidir_gbps, x->raw_bidir_gbps), 3);
	json_f64(&j, "memcpy_gbps", x->raw_bidir_gbps, 2);
	json_f64(&j, "sequential_gbps", x->seq_gbps, 2);
	json_str(&j, "note", "gbps: the engine onloads half the users (read-only "
		 "prepares) and offloads the other half (engine_offload_all) back "
		 "to back, timed until every copy has landed, bytes moved both ways "
		 "over that time; the two directions overlap only as far as the "
		 "engine lets them (a synchronous engine copies one after the "
		 "other). sequential_gbps: the offload and onload figures above "
		 "one after the other (2 x bytes over both times). memcpy_gbps, the "
		 "ceiling: raw pinned cudaMemcpyAsync in both directions at once on "
		 "two streams, half the bytes each way");
	json_obj_end(&j);

	json_obj_begin(&j, "transfer");
	json_str(&j, "layout", spec);
	json_u64(&j, "page_bytes", o->layout.page_bytes);
	json_u64(&j, "pages", x->pages);
	json_u64(&j, "users", x->users);
	json_u64(&j, "bytes", x->bytes);
	json_str(&j, "bytes_counted", "bytes moved, once");
	json_str(&j, "timing", "wall clock around the engine calls and around "
		 "enqueue + cudaStreamSynchronize of the raw copies; median of reps");
	json_bool(&j, "counters_ok", x->counters_ok);
	json_obj_end(&j);

	json_lat_map(&j, "append_latency_us", r->lat.p50_us);
	json_obj_begin(&j, "append_latency");
	json_str(&j, "layout", spec);
	json_u64(&j, "token_bytes", o->layout.token_bytes);
	json_u64(&j, "samples", r->lat.samples);
	json_str(&j, "how", "kvp_append_cuda of one token per user, each into a "
		 "random slot, slots and source on the device; a CUDA event pair "
		 "around the launch, synchronised every time; median");
	json_lat_map(&j, "p50_us", r->lat.p50_us);
	json_lat_map(&j, "p99_us", r->lat.p99_us);
	json_lat_map(&j, "d2d_p50_us", r->lat.d2d_p50_us);
	json_obj_end(&j);

	json_obj_begin(&j, "config");
	json_str(&j, "layout", spec);
	json_u64(&j, "mib", o->mib);
	json_u64(&j, "device", o->device);
	json_u64(&j, "reps", o->reps);
	json_u64(&j, "samples", o->samples);
	json_obj_end(&j);

	json_obj_begin(&j, "machine");
	json_str(&j, "gpu", r->gpu.name);
	json_str(&j, "driver", r->gpu.driver[0] ? r->gpu.driver : NULL);
	{
		char v[32];

		snprintf(v, sizeof(v), "%d.%d", r->gpu.cuda_driver / 1000,
			 r->gpu.cuda_driver % 1000 / 10);
		json_str(&j, "cuda_driver_api", v);
		snprintf(v, sizeof(v), "%d.%d", r->gpu.cuda_runtime / 1000,
			 r->gpu.cuda_runtime % 1000 / 10);
		json_str(&j, "cuda_runtime", v);
		snprintf(v, sizeof(v), "%d.%d", r->gpu.cc_major, r->gpu.cc_minor);
		json_str(&j, "compute_capability", v);
	}
	json_u64(&j, "device", o->device);
	json_str(&j, "pci_bus_id", r->gpu.pci_bus_id);
	json_i64(&j, "sms", r->gpu.sms);
	json_u64(&j, "memory_bytes", r->gpu.memory_bytes);
	json_str(&j, "cpu_model", r->host.cpu_model);
	json_i64(&j, "nproc", r->host.nproc);
	json_str(&j, "kernel", r->host.kernel);
	json_obj_end(&j);
	json_str(&j, "date", r->host.date);
	json_str(&j, "command", kvb_command_line());
	json_end(&j);
	fflush(stdout);
}

static void print_append(const struct gpu_opts *o, const struct gpu_append *a)
{
	char spec[256];

	kvp_layout_format(&a->l, spec, sizeof(spec));
	printf("\nappend: %s\n", spec);
	printf("  %" PRIu64 " tokens in one launch into every slot of %" PRIu64 " pages "
	       "(%.0f MiB),\n  rows of %" PRIu64 " B; median of %" PRIu64 "\n",
	       a->tokens, a->pages, a->bytes / 1048576.0, a->l.token_stride, o->reps);
	printf("  %-36s %9.1f GB/s  %6.3f of d2d  check %s\n",
	       "kvp_append_cuda, slots shuffled", a->gbps, ratio(a->gbps, a->d2d_gbps),
	       a->verified ? "ok" : "FAILED");
	printf("  %-36s %9.1f GB/s  %6.3f of d2d  check %s\n",
	       "kvp_append_layers_cuda, slots shuf.", a->layers_gbps,
	       ratio(a->layers_gbps, a->d2d_gbps), a->layers_verified ? "ok" : "FAILED");
	printf("  %-36s %9.1f GB/s  %6.3f of d2d\n", "kvp_append_cuda, pages shuffled",
	       a->pages_gbps, ratio(a->pages_gbps, a->d2d_gbps));
	printf("  %-36s %9.1f GB/s  (ceiling)\n", "cudaMemcpy device to device", a->d2d_gbps);
}

void gpu_print_table(const struct gpu_opts *o, const struct gpu_results *r)
{
	const struct gpu_xfer *x = &r->xfer;
	char spec[256];

	kvp_layout_format(&o->layout, spec, sizeof(spec));
	printf("kvbench gpu on device %" PRIu64 ": %s (%d SMs, %.0f GiB, driver %s, "
	       "CUDA %d.%d), %s\n", o->device, r->gpu.name, r->gpu.sms,
	       r->gpu.memory_bytes / 1073741824.0, r->gpu.driver[0] ? r->gpu.driver : "?",
	       r->gpu.cuda_driver / 1000, r->gpu.cuda_driver % 1000 / 10, r->host.date);
	printf("append bandwidth counts bytes read + written (2 x the bytes appended), "
	       "as does its d2d ceiling\n");
	print_append(o, &r->append);
	print_append(o, &r->small);

	printf("\noffload / onload through the engine (cuda backend): %s\n", spec);
	printf("  %" PRIu64 " pages of %" PRIu64 " B (%.0f MiB) held by %" PRIu64
	       " users; bytes moved once; median of %" PRIu64 "; counters %s\n",
	       x->pages, o->layout.page_bytes, x->bytes / 1048576.0, x->users, o->reps,
	       x->counters_ok ? "ok" : "WRONG");
	printf("  %-34s %9s %11s %9s %13s\n", "", "engine", "raw memcpy", "ratio",
	       "raw per page");
	printf("  %-34s %9.1f %11.1f %9.3f %13.1f\n", "offload (device to host), GB/s",
	       x->offload_gbps, x->raw_d2h_gbps, ratio(x->offload_gbps, x->raw_d2h_gbps),
	       x->raw_d2h_page_gbps);
	printf("  %-34s %9.1f %11.1f %9.3f %13.1f\n", "onload (host to device), GB/s",
	       x->onload_gbps, x->raw_h2d_gbps, ratio(x->onload_gbps, x->raw_h2d_gbps),
	       x->raw_h2d_page_gbps);
	printf("  %-34s %9.1f %11.1f %9.3f\n", "both directions, GB/s", x->bidir_gbps,
	       x->raw_bidir_gbps, ratio(x->bidir_gbps, x->raw_bidir_gbps));
	printf("  %-34s %9.1f\n", "offload then onload, GB/s", x->seq_gbps);
	printf("  (both directions: the engine onloads half the users and offloads the\n"
	       "   others back to back, overlapped only as far as it allows; raw: both\n"
	       "   directions at once on two streams, half the bytes each way)\n");

	printf("\nbatched one-token append latency: %s (%" PRIu64 " B a token), "
	       "%" PRIu64 " samples\n", spec, o->layout.token_bytes, r->lat.samples);
	printf("  %-10s %10s %10s %16s\n", "users", "p50 us", "p99 us", "d2d p50 us");
	for (int k = 0; k < GPU_LAT_BATCHES; k++)
		printf("  %-10" PRIu32 " %10.2f %10.2f %16.2f\n", gpu_lat_users[k],
		       r->lat.p50_us[k], r->lat.p99_us[k], r->lat.d2d_p50_us[k]);
}

int cmd_gpu(int argc, char **argv)
{
	struct gpu_results *r;
	struct gpu_opts o;
	bool measured = false;
	int rc = gpu_parse_opts(argc, argv, &o);

	if (rc >= 0)
		return rc;
	r = calloc(1, sizeof(*r));
	if (!r) {
		fprintf(stderr, "kvbench gpu: out of memory\n");
		return KVB_EXIT_FAIL;
	}
	rc = gpu_measure(&o, r, &measured);
	if (measured) {
		if (o.json)
			gpu_print_json(&o, r);
		else
			gpu_print_table(&o, r);
	}
	gpu_results_free(r);
	free(r);
	return rc;
}

#endif /* KVPOOL_HAVE_CUDA */
