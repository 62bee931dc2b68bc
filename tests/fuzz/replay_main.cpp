// The fuzz targets without libFuzzer (GCC builds, every sanitizer build): runs the target on every
// file of the seed corpus folders given on the command line, then on pseudo-random mutations of
// them (bit flips, interesting integers, inserted, erased and repeated bytes, cuts, splices), the
// same every run. An input that crashes (a sanitizer report, an abort, a fault) is written to
// <target>.crash-input in the working directory, to replay (`<target> <that file>`) and then add
// to the corpus.
//   usage: <target> [--mutations N] [--seed S] corpus-dir-or-file...
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
// Present in sanitizer builds: called when a sanitizer ends the process after its report.
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace {

using input = std::vector<std::uint8_t>;

struct rng {
  std::uint64_t s;
  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return n ? std::size_t(next() % n) : 0; }
};

input read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return input(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void mutate_once(input& x, const std::vector<input>& seeds, rng& r) {
  static const std::uint64_t interesting[] = {0, 1, 2, 0x7f, 0x80, 0xff, 0x7fff, 0xffff, 0x7fffffff, 0x80000000,
                                              0xffffffff, 0x100000000ull, 0x7fffffffffffffffull, ~0ull, 4, 8, 32};
  switch (r.below(8)) {
    case 0:  // flip a bit
      if (!x.empty()) x[r.below(x.size())] ^= std::uint8_t(1u << r.below(8));
      break;
    case 1:  // a random byte
      if (!x.empty()) x[r.below(x.size())] = std::uint8_t(r.next());
      break;
    case 2: {  // an interesting 1/2/4/8-byte integer, little-endian
      const std::size_t width = std::size_t(1) << r.below(4);
      if (x.size() < width) break;
      const std::uint64_t v = interesting[r.below(std::size(interesting))];
      std::memcpy(x.data() + r.below(x.size() - width + 1), &v, width);
      break;
    }
    case 3: {  // insert random bytes
      const std::size_t at = r.below(x.size() + 1), n = 1 + r.below(16);
      for (std::size_t i = 0; i < n; ++i) x.insert(x.begin() + std::ptrdiff_t(at), std::uint8_t(r.next()));
      break;
    }
    case 4: {  // erase a run
      if (x.empty()) break;
      const std::size_t at = r.below(x.size()), n = 1 + r.below(std::min<std::size_t>(32, x.size() - at));
      x.erase(x.begin() + std::ptrdiff_t(at), x.begin() + std::ptrdiff_t(at + n));
      break;
    }
    case 5: {  // repeat a run
      if (x.empty() || x.size() > (64u << 10)) break;
      const std::size_t at = r.below(x.size()), n = 1 + r.below(std::min<std::size_t>(64, x.size() - at));
      const input run(x.begin() + std::ptrdiff_t(at), x.begin() + std::ptrdiff_t(at + n));
      x.insert(x.begin() + std::ptrdiff_t(r.below(x.size() + 1)), run.begin(), run.end());
      break;
    }
    case 6:  // cut
      x.resize(r.below(x.size() + 1));
      break;
    default: {  // splice: our head, another seed's tail
      const input& other = seeds[r.below(seeds.size())];
      const std::size_t head = r.below(x.size() + 1), from = r.below(other.size() + 1);
      x.resize(head);
      x.insert(x.end(), other.begin() + std::ptrdiff_t(from), other.end());
      break;
    }
  }
}

input current;                // the input in flight
std::string crash_input_path;

void save_current() {  // async-signal-safe: open, write, close
  const int fd = ::open(crash_input_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return;
  for (std::size_t done = 0; done < current.size();) {
    const ssize_t n = ::write(fd, current.data() + done, current.size() - done);
    if (n <= 0) break;
    done += std::size_t(n);
  }
  ::close(fd);
  static const char note[] = "\nreplay: the input that failed is in *.crash-input (working directory)\n";
  (void)!::write(2, note, sizeof note - 1);
}

void on_fatal_signal(int sig) {
  save_current();
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void run(const input& x) {
  current = x;
  LLVMFuzzerTestOneInput(current.data(), current.size());
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mutations = 2000;
  std::uint64_t seed = 1;
  std::vector<input> seeds;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mutations" && i + 1 < argc) {
      mutations = std::stoul(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (std::filesystem::is_directory(a)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(a)) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) seeds.push_back(read_file(f));
    } else if (std::filesystem::is_regular_file(a)) {
      seeds.push_back(read_file(a));
    } else {
      std::fprintf(stderr, "%s: no such corpus folder or file: %s\n", argv[0], a.c_str());
      return 2;
    }
  }
  if (seeds.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations N] [--seed S] corpus-dir-or-file...\n", argv[0]);
    return 2;
  }
  crash_input_path = std::filesystem::path(argv[0]).filename().string() + ".crash-input";
  if (__sanitizer_set_death_callback) {
    __sanitizer_set_death_callback(save_current);
  } else {
    for (const int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_fatal_signal);
  }
  for (const input& s : seeds) run(s);
  rng r{seed};
  for (std::size_t i = 0; i < mutations; ++i) {
    input x = seeds[r.below(seeds.size())];
    for (std::size_t k = 1 + r.below(4); k > 0; --k) mutate_once(x, seeds, r);
    run(x);
  }
  std::printf("%zu seed inputs and %zu mutations ran cleanly\n", seeds.size(), mutations);
  return 0;
}
