/* A disk that fills while the program runs and frees again (with
 * diskfull_shim.so preloaded): rounds of malloc/free pairs of sizes 100,
 * 101, ..., 299, a round every millisecond. 100 rounds, until some reached
 * the spool; the disk full for 50 rounds, a thread that starts and ends, and
 * 60 ms more; then 100 rounds and 4 M pairs on free disk, and the peak RSS
 * (the rings must still be drained, though the spool takes nothing more). */
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void disk_full(int on) __attribute__((weak));

static void pairs(int n) {
	for (int i = 0; i < n; i++) {
		void *volatile p = malloc(100 + i % 200);
		free(p);
	}
}

static void rounds(int n) {
	struct timespec ms = {0, 1000000};
	for (int r = 0; r < n; r++) {
		pairs(200);
		nanosleep(&ms, NULL);
	}
}

static long spool_size(void) {
	DIR *d = opendir("/proc/self/fd");
	long size = -1;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char p[300], l[4096];
		snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(p, l, sizeof l - 1);
		struct stat st;
		if (n >= 9 && memcmp(l + n - 9, "spool.bin", 9) == 0 && stat(p, &st) == 0) size = st.st_size;
	}
	if (d) closedir(d);
	return size;
}

static void *one_thread(void *arg) {
	pairs(100);
	return arg;
}

int main(void) {
	if (!disk_full) {
		fprintf(stderr, "diskfull_shim.so is not preloaded\n");
		return 1;
	}
	rounds(100);
	struct timespec ms10 = {0, 10000000};
	for (int i = 0; i < 1000 && spool_size() < 32768; i++) nanosleep(&ms10, NULL);
	disk_full(1);
	rounds(50);
	pthread_t th;
	pthread_create(&th, NULL, one_thread, NULL);
	pthread_join(th, NULL);
	struct timespec wait = {0, 60000000}; /* the drain meets the full disk */
	nanosleep(&wait, NULL);
	disk_full(0);
	rounds(100);
	pairs(4000000);
	char line[256];
	FILE *f = fopen("/proc/self/status", "r");
	while (f && fgets(line, sizeof line, f))
		if (strncmp(line, "VmHWM:", 6) == 0) printf("peak_rss_kb %ld\n", atol(line + 6));
	if (f) fclose(f);
	return 0;
}
