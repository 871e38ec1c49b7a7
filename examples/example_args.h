// A tiny command-line reader shared by the examples: `--name value` pairs with defaults, so that
// each example needs no dependency but ringgrad. A bad flag throws rg::Error like any other error.
#pragma once

#include <ringgrad/engine/error.h>

#include <cstdint>
#include <map>
#include <string>

namespace examples {

class Args {
 public:
  // `defaults` names every flag the program accepts (without "--") and its default value.
  Args(int argc, char** argv, std::map<std::string, std::string> defaults)
      : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      const auto it = flag.starts_with("--") ? values_.find(flag.substr(2)) : values_.end();
      if (it == values_.end()) throw rg::Error("unknown argument '" + flag + "'; flags: " + usage());
      if (i + 1 == argc) throw rg::Error(flag + " needs a value");
      it->second = argv[++i];
    }
  }

  std::string str(const std::string& name) const { return values_.at(name); }
  int64_t integer(const std::string& name) const {
    return parse<int64_t>(name, [](const std::string& v, size_t* used) { return std::stoll(v, used); });
  }
  double real(const std::string& name) const {
    return parse<double>(name, [](const std::string& v, size_t* used) { return std::stod(v, used); });
  }

 private:
  // stoll/stod over the whole value; anything else (empty, trailing text, overflow) is an rg::Error.
  template <class T, class F>
  T parse(const std::string& name, F&& convert) const {
    const std::string& v = values_.at(name);
    size_t used = 0;
    T n{};
    try {
      n = convert(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v.size()) throw rg::Error("--" + name + " " + v + ": not a number");
    return n;
  }
  std::string usage() const {
    std::string out;
    for (const auto& [name, value] : values_) out += " --" + name + " " + value;
    return out;
  }
  std::map<std::string, std::string> values_;
};

}  // namespace examples
