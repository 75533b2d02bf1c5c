// Runs a libFuzzer target over files, without libFuzzer: each file named on
// the command line, or each file in a directory named there, is one input.
// Builds that are not clang fuzzing builds replay the committed corpus this
// way, as a unit test. `--write_seeds DIR` writes the seed inputs
// (fuzz_seeds.cc) instead.
#include <dirent.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace segps {
// The seed inputs by file name (fuzz_seeds.cc).
std::vector<std::pair<std::string, std::string>> FuzzSeeds();
}  // namespace segps

namespace {

int Replay(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return 1;
  }
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // libFuzzer's contract: 0, or -1 to keep an input out of the corpus;
  // anything else is the target reporting a failure.
  const int rc = LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  if (rc != 0 && rc != -1) {
    std::fprintf(stderr, "replay: %s: the target returned %d\n", path.c_str(), rc);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--write_seeds") {
    for (const auto& [name, bytes] : segps::FuzzSeeds()) {
      std::ofstream(std::string(argv[2]) + "/" + name, std::ios::binary) << bytes;
    }
    return 0;
  }
  int failures = 0, inputs = 0;
  for (int i = 1; i < argc; ++i) {
    struct stat st;
    if (stat(argv[i], &st) != 0) {
      std::fprintf(stderr, "replay: no such file or directory: %s\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
      failures += Replay(argv[i]);
      ++inputs;
      continue;
    }
    DIR* dir = opendir(argv[i]);
    while (dirent* entry = readdir(dir)) {
      if (entry->d_name[0] == '.') continue;
      failures += Replay(std::string(argv[i]) + "/" + entry->d_name);
      ++inputs;
    }
    closedir(dir);
  }
  std::printf("replay: %d inputs ran\n", inputs);
  return failures == 0 && inputs > 0 ? 0 : 1;
}
