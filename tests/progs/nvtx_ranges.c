// NVTX through its own headers (nvtx3, from PyPI's nvidia-nvtx), as any
// library built with them calls it: marks, pushed and started ranges, a
// domain with a registered string, and ranges pushed on another thread.
// Under msmemscope each becomes an MSTX row (libmemscope/nvtx.c).
#include <nvtx3/nvToolsExt.h>
#include <pthread.h>
#include <stdio.h>

static void *worker(void *arg) {
	(void)arg;
	nvtxRangePushA("worker");
	nvtxMarkA("in worker");
	nvtxRangePop();
	return NULL;
}

int main(void) {
	nvtxMarkA("hello");
	nvtxRangePushA("outer");
	nvtxRangePushA("step start");
	int inner = nvtxRangePop(), outer = nvtxRangePop();
	if (inner >= 0 && (inner != 1 || outer != 0)) return 2; // the levels ended (negative: no tool)
	nvtxRangeId_t id = nvtxRangeStartA("started");
	nvtxRangeEnd(id);

	nvtxDomainHandle_t d = nvtxDomainCreateA("mydomain");
	nvtxStringHandle_t s = nvtxDomainRegisterStringA(d, "registered");
	nvtxEventAttributes_t a = {0};
	a.version = NVTX_VERSION;
	a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
	a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
	a.message.registered = s;
	nvtxDomainRangePushEx(d, &a);
	nvtxEventAttributes_t b = a;
	b.messageType = NVTX_MESSAGE_TYPE_ASCII;
	b.message.ascii = "ascii in domain";
	nvtxDomainMarkEx(d, &b);
	nvtxDomainRangePop(d);

	// Ranges nest per domain: B's first push is level 0 beside A's open
	// range; popping a domain with nothing open ends nothing.
	nvtxDomainHandle_t da = nvtxDomainCreateA("A"), db = nvtxDomainCreateA("B");
	nvtxEventAttributes_t ea = b, eb = b;
	ea.message.ascii = "in A";
	eb.message.ascii = "in B";
	int la = nvtxDomainRangePushEx(da, &ea), lb = nvtxDomainRangePushEx(db, &eb);
	int none = nvtxDomainRangePop(d); // d has nothing open
	int pa = nvtxDomainRangePop(da), pb = nvtxDomainRangePop(db);
	if (la >= 0 && (la != 0 || lb != 0 || none != -2 || pa != 0 || pb != 0)) return 3;

	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	pthread_join(t, NULL);
	puts("ok");
	return 0;
}
