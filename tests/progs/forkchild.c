/* The parent allocates, forks a child that allocates (and leaks) and exits,
 * waits for it, then allocates again. The child is not traced (SPEC §4.5). */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;

static void work(int n, size_t base, int keep_every) {
	for (int i = 0; i < n; i++) {
		char *p = malloc(base + (size_t)i);
		memset(p, 7, base + (size_t)i);
		sink = p;
		if (i % keep_every) free(p);
	}
}

int main(void) {
	work(100, 100, 10);
	pid_t pid = fork();
	if (pid < 0) return 1;
	if (pid == 0) {
		work(500, 3000, 2); /* the child's own heap: not the parent's */
		exit(0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return 2;
	work(200, 50, 7);
	return 0;
}
