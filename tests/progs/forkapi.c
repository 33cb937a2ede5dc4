/* Every call of include/msmemscope.h, in the parent and then in a forked
 * child. In the parent the data calls return replies; in the child every call
 * is refused (-1, 0 or NULL) by a C check before Go is entered: a Go runtime
 * entered in a forked child hangs or crashes, which the alarm turns into a
 * failure. Prints "parent ok" and "child ok"; exits non-zero on a failure. */
#include <msmemscope.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int fails;

static void check(int ok, const char *what) {
	if (!ok) {
		fprintf(stderr, "FAIL %s\n", what);
		fails++;
	}
}

/* A reply in the parent: it starts with want; freed here. */
static void reply(char *r, const char *want, const char *what) {
	check(r && strncmp(r, want, strlen(want)) == 0, what);
	if (r && strncmp(r, want, strlen(want))) fprintf(stderr, "  got %s\n", r);
	msmemscope_free_string(r);
}

#define REFUSED(call) check((call) == -1, #call)
#define NO_REPLY(call) check((call) == NULL, #call)

int main(void) {
	static const char data[] = "hash me";
	uint64_t h = msmemscope_hash64(data, sizeof data);

	check(msmemscope_step() == 0, "msmemscope_step");
	check(msmemscope_interposed() == 1, "msmemscope_interposed");
	check(msmemscope_standalone() == 0, "msmemscope_standalone");
	check(msmemscope_in_child() == 0, "msmemscope_in_child in the parent");
	reply(msmemscope_get_mem_report(), "{\"ok\":true,\"result\":{\"total_size\":", "get_mem_report");
	reply(msmemscope_list_analyzers(), "{\"ok\":true,\"result\":[\"leaks\"", "list_analyzers");
	reply(msmemscope_analyzer_config("nope"), "{\"ok\":false,\"type\":\"ValueError\"", "analyzer_config");
	reply(msmemscope_analyze("leaks", "[]"), "{\"ok\":false,\"type\":\"TypeError\"", "analyze");
	reply(msmemscope_get_all_time_size("/nonexistent", 100), "{\"ok\":false,\"type\":\"FileNotFoundError\"", "get_all_time_size");
	reply(msmemscope_get_mem_report_with_time("/nonexistent", 0, 100), "{\"ok\":false,\"type\":\"FileNotFoundError\"", "get_mem_report_with_time");
	reply(msmemscope_export("/nonexistent", "pprof", NULL), "{\"ok\":false,\"type\":\"FileNotFoundError\"", "export");
	reply(msmemscope_config("[[\"colour\", \"red\"]]"), "{\"ok\":false,\"type\":\"ValueError\"", "config");
	reply(msmemscope_get_config(), "{\"ok\":true,\"result\":{", "get_config");
	reply(msmemscope_dir(), "{\"ok\":true,\"result\":\"/", "dir");
	msmemscope_free_string(NULL);
	if (!fails) printf("parent ok\n");
	fflush(stdout);

	pid_t pid = fork();
	if (pid < 0) return 2;
	if (pid == 0) {
		alarm(20);
		REFUSED(msmemscope_start());
		REFUSED(msmemscope_stop());
		REFUSED(msmemscope_step());
		REFUSED(msmemscope_interposed());
		REFUSED(msmemscope_standalone());
		REFUSED(msmemscope_describe(0x1000, "x"));
		REFUSED(msmemscope_describe_push("x"));
		REFUSED(msmemscope_describe_pop());
		REFUSED(msmemscope_python_package("/"));
		REFUSED(msmemscope_torch_event(40, 1, "x", 1));
		REFUSED(msmemscope_torch_op(40, 1, "x", 1));
		REFUSED(msmemscope_own(1));
		check(msmemscope_in_child() == 1, "msmemscope_in_child");
		check(mstxRangeStartA("child", NULL) == 0, "mstxRangeStartA");
		mstxMarkA("child", NULL);
		mstxRangeEnd(1);
		NO_REPLY(msmemscope_get_mem_report());
		NO_REPLY(msmemscope_get_all_time_size(".", 100));
		NO_REPLY(msmemscope_get_mem_report_with_time(".", 0, 100));
		NO_REPLY(msmemscope_export(".", "pprof", NULL));
		NO_REPLY(msmemscope_list_analyzers());
		NO_REPLY(msmemscope_analyzer_config("leaks"));
		NO_REPLY(msmemscope_analyze("leaks", "{}"));
		NO_REPLY(msmemscope_config("[]"));
		NO_REPLY(msmemscope_get_config());
		NO_REPLY(msmemscope_py_begin());
		NO_REPLY(msmemscope_py_start());
		NO_REPLY(msmemscope_py_stop());
		NO_REPLY(msmemscope_dir());
		NO_REPLY(msmemscope_window_begin());
		NO_REPLY(msmemscope_window_end(5));
		REFUSED(msmemscope_exit_files(0));
		msmemscope_free_string(NULL);
		check(msmemscope_hash64(data, sizeof data) == h, "msmemscope_hash64");
		if (!fails) printf("child ok\n");
		fflush(stdout);
		_exit(fails ? 1 : 0);
	}
	int st;
	if (waitpid(pid, &st, 0) != pid) return 2;
	if (!WIFEXITED(st)) {
		fprintf(stderr, "child killed by signal %d (a call entered Go?)\n", WTERMSIG(st));
		return 3;
	}
	return fails || WEXITSTATUS(st) ? 1 : 0;
}
