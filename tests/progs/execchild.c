/* fork + exec of another test program (argv[1]); both images are traced, each
 * into its own folder. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void *volatile sink;

int main(int argc, char **argv) {
	if (argc < 2) return 1;
	for (int i = 0; i < 50; i++) {
		char *p = malloc(64 + (size_t)i);
		sink = p;
		if (i % 5) free(p);
	}
	pid_t pid = fork();
	if (pid < 0) return 1;
	if (pid == 0) {
		char *p = malloc(999); /* before exec, in the forked child: gone with the image */
		sink = p;
		execv(argv[1], argv + 1);
		_exit(127);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st)) return 2;
	char *q = calloc(10, 10);
	sink = q;
	return 0;
}
