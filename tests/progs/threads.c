/* 8 threads x 100k allocations of mixed sizes through malloc, calloc and
 * realloc; most freed, one in 1000 kept until exit. It first prints how many
 * TLS modules the process has (each thread's DTV is sized by it). */
#define TLSMODS_NO_MAIN
#include "tlsmods.c"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 8
#define PER_THREAD 100000

static void *volatile sink;

static void *worker(void *arg) {
	unsigned id = (unsigned)(size_t)arg;
	unsigned x = 12345u + id * 7919u;
	char *prev = NULL;
	for (int i = 0; i < PER_THREAD; i++) {
		x = x * 1103515245u + 12345u;
		size_t n = 1 + (x >> 8) % 2048;
		char *p;
		switch (i % 3) {
		case 0: p = malloc(n); break;
		case 1: p = calloc(1, n); break;
		default: p = realloc(NULL, n); break;
		}
		p[0] = (char)i;
		sink = p;
		if (i % 1000 == 999) continue; /* kept */
		if (prev) free(prev);
		prev = p;
	}
	free(prev);
	return NULL;
}

int main(void) {
	pthread_t th[THREADS];
	print_tls_modules();
	for (int i = 0; i < THREADS; i++)
		if (pthread_create(&th[i], NULL, worker, (void *)(size_t)i)) return 1;
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
	return 0;
}
