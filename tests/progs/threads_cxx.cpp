// A threaded C++ program for the HTML report: three mstx steps; in each,
// four producer threads make Items that a consumer thread deletes (frees
// from another thread), and lose_session() drops a Session: 3 definitely
// lost blocks of sizeof(Session). Before the threads, scratch() makes 100
// temporary allocations (each freed before any other allocation).
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <mstx/ms_tools_ext.h>

struct Item {
	char payload[512];
};
struct Session {
	long id;
	char buffer[3000];
};

static std::mutex mu;
static std::condition_variable cv;
static std::deque<Item *> queue;
static bool done;
static void *volatile sink;

static __attribute__((noinline)) void scratch(int i) {
	char *p = new char[256];
	memset(p, i, 256);
	sink = p;
	delete[] p;
}

static __attribute__((noinline)) void lose_session(long id) {
	Session *s = new Session;
	s->id = id;
	memset(s->buffer, 1, sizeof s->buffer);
	sink = nullptr; // the only pointer goes with this frame
}

static __attribute__((noinline)) Item *produce(int n) {
	Item *it = new Item;
	memset(it->payload, n, sizeof it->payload);
	return it;
}

static void producer(int per) {
	for (int i = 0; i < per; i++) {
		Item *it = produce(i);
		std::lock_guard<std::mutex> g(mu);
		queue.push_back(it);
		cv.notify_one();
	}
}

static void consumer() {
	std::unique_lock<std::mutex> g(mu);
	for (;;) {
		cv.wait(g, [] { return done || !queue.empty(); });
		while (!queue.empty()) {
			delete queue.front(); // freed by another thread than the one that made it
			queue.pop_front();
		}
		if (done)
			return;
	}
}

int main() {
	for (int i = 0; i < 100; i++)
		scratch(i);
	for (int step = 1; step <= 3; step++) {
		uint64_t id = mstxRangeStartA("step start", nullptr);
		done = false;
		std::thread c(consumer);
		std::vector<std::thread> ps;
		for (int i = 0; i < 4; i++)
			ps.emplace_back(producer, 200);
		for (auto &p : ps)
			p.join();
		{
			std::lock_guard<std::mutex> g(mu);
			done = true;
			cv.notify_one();
		}
		c.join();
		lose_session(step);
		mstxRangeEnd(id);
	}
	return 0;
}
