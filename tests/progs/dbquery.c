// A million rows for the SQLite dump's typed view: 500,000 MALLOC/FREE
// pairs of 16..215 bytes (57,750,000 bytes), then 1,000 blocks of 64 kept.
#include <stdlib.h>

void *volatile sink;

int main(void) {
	for (int i = 0; i < 500000; i++) {
		void *p = malloc(16 + i % 200);
		sink = p;
		free(p);
	}
	for (int i = 0; i < 1000; i++) sink = malloc(64);
	return 0;
}
