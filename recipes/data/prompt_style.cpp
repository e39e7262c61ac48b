#include "strata/recipes/data/prompt_style.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

namespace strata::recipes {

namespace {

namespace fs = std::filesystem;

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

class Alpaca : public PromptStyle {
 public:
  std::string name() const override { return "alpaca"; }
  bool appends_eos() const override { return true; }
  std::vector<PromptSegment> render(const InstructRecord& r) const override {
    std::string instruction = r.instruction, input = r.input, output = r.output;
    if (!r.messages.empty()) {
      // A chat record of one question and its answer reads as an instruction.
      TORCH_CHECK_VALUE(r.messages.size() == 2 && r.messages[0].role == "user" && r.messages[1].role == "assistant",
                        "prompt style alpaca takes one user message and its answer; this record has ",
                        r.messages.size(), " messages (choose a chat style: --prompt-style chatml, llama3, ...)");
      instruction = r.messages[0].content;
      output = r.messages[1].content;
    }
    const std::string prompt =
        input.empty() ? "Below is an instruction that describes a task. Write a response that appropriately "
                        "completes the request.\n\n### Instruction:\n" + instruction + "\n\n### Response:\n"
                      : "Below is an instruction that describes a task, paired with an input that provides further "
                        "context. Write a response that appropriately completes the request.\n\n### Instruction:\n" +
                            instruction + "\n\n### Input:\n" + input + "\n\n### Response:\n";
    return {{prompt, false}, {output, true}};
  }
  std::string generation_prompt(const std::vector<ChatMessage>& messages) const override {
    InstructRecord r;
    for (const auto& m : messages) {
      if (m.role == "user") r.instruction = m.content;
    }
    TORCH_CHECK_VALUE(!r.instruction.empty(), "prompt style alpaca needs a user message");
    return render(r).front().text;
  }
};

/// A chat style: each message as its role's opening, the content and the
/// role's closing (then `after`, untrained); an assistant's content and
/// closing are trained.
class Chat : public PromptStyle {
 public:
  struct Role {
    std::string open, close;
  };
  struct Markers {
    std::string name, begin;  ///< begin: once, before the first message
    Role system, user, assistant;
    std::string after;         ///< after every message (not trained)
    bool trim_content = false;
    bool system_into_user = false;  ///< no system role: prepended to the first user turn
    std::string finish = "";        ///< after the conversation (trained: Phi-3's EOS)
    /// After the assistant's opening of each answer that follows the last
    /// user turn (Qwen3's empty think block), not trained.
    std::string answer_prefix = "";
  };
  explicit Chat(Markers m) : m_(std::move(m)) {}
  std::string name() const override { return m_.name; }
  bool writes_bos() const override { return !m_.begin.empty(); }
  std::string generation_prompt(const std::vector<ChatMessage>& messages) const override {
    InstructRecord r;
    r.messages = messages;
    std::string text;
    for (const auto& seg : render(r)) text += seg.text;
    // The conversation's closing (Phi-3's EOS) belongs to a finished one only.
    if (!m_.finish.empty() && text.size() >= m_.finish.size()) text.resize(text.size() - m_.finish.size());
    return text + m_.assistant.open + m_.answer_prefix;
  }
  std::vector<PromptSegment> render(const InstructRecord& r) const override {
    std::vector<PromptSegment> out{{m_.begin, false}};
    std::string pending_system;
    const auto turns = r.conversation();
    size_t last_user = 0;
    for (size_t i = 0; i < turns.size(); ++i)
      if (turns[i].role == "user") last_user = i;
    for (size_t i = 0; i < turns.size(); ++i) {
      const ChatMessage& msg = turns[i];
      TORCH_CHECK_VALUE(msg.role == "system" || msg.role == "user" || msg.role == "assistant", "message role '",
                        msg.role, "' is not one of system, user, assistant");
      const std::string content = m_.trim_content ? trim(msg.content) : msg.content;
      if (msg.role == "system" && m_.system_into_user) {
        pending_system = content + "\n\n";
        continue;
      }
      const Role& role = msg.role == "system" ? m_.system : msg.role == "user" ? m_.user : m_.assistant;
      if (msg.role == "assistant") {
        out.push_back({role.open + (i > last_user ? m_.answer_prefix : ""), false});
        out.push_back({content + role.close, true});
        out.push_back({m_.after, false});
      } else {
        out.push_back({role.open + pending_system + content + role.close + m_.after, false});
        pending_system.clear();
      }
    }
    out.push_back({m_.finish, true});
    std::erase_if(out, [](const PromptSegment& s) { return s.text.empty(); });
    return out;
  }

 private:
  Markers m_;
};

}  // namespace

std::vector<ChatMessage> InstructRecord::conversation() const {
  if (!messages.empty()) return messages;
  return {{"user", input.empty() ? instruction : instruction + "\n\n" + input}, {"assistant", output}};
}

std::vector<std::string> prompt_style_names() {
  return {"alpaca", "llama3", "chatml", "qwen3", "mistral", "zephyr", "phi3"};
}

std::unique_ptr<PromptStyle> make_prompt_style(const std::string& name) {
  if (name == "alpaca") return std::make_unique<Alpaca>();
  const std::string h = "<|start_header_id|>", e = "<|end_header_id|>\n\n";
  using R = Chat::Role;
  if (name == "llama3") {
    return std::make_unique<Chat>(Chat::Markers{"llama3", "<|begin_of_text|>", R{h + "system" + e, "<|eot_id|>"},
                                                R{h + "user" + e, "<|eot_id|>"}, R{h + "assistant" + e, "<|eot_id|>"},
                                                "", true, false});
  }
  if (name == "chatml" || name == "qwen3") {
    // Qwen3: ChatML with an empty think block before the final answers (its
    // template without thinking, enable_thinking=False when generating).
    return std::make_unique<Chat>(Chat::Markers{name, "", R{"<|im_start|>system\n", "<|im_end|>"},
                                                R{"<|im_start|>user\n", "<|im_end|>"},
                                                R{"<|im_start|>assistant\n", "<|im_end|>"}, "\n", false, false, "",
                                                name == "qwen3" ? "<think>\n\n</think>\n\n" : ""});
  }
  if (name == "mistral") {
    return std::make_unique<Chat>(
        Chat::Markers{"mistral", "<s>", R{}, R{"[INST] ", " [/INST]"}, R{"", "</s>"}, "", false, true});
  }
  if (name == "zephyr") {
    return std::make_unique<Chat>(Chat::Markers{"zephyr", "", R{"<|system|>\n", "</s>"}, R{"<|user|>\n", "</s>"},
                                                R{"<|assistant|>\n", "</s>"}, "\n", false, false});
  }
  if (name == "phi3") {
    return std::make_unique<Chat>(Chat::Markers{"phi3", "", R{"<|system|>\n", "<|end|>"}, R{"<|user|>\n", "<|end|>"},
                                                R{"<|assistant|>\n", "<|end|>"}, "\n", false, false, "<|endoftext|>"});
  }
  TORCH_CHECK_VALUE(false, "unknown prompt style '", name, "'; allowed: ", c10::Join(", ", prompt_style_names()),
                    ", or auto (the tokenizer's)");
}

std::string prompt_style_for(const std::string& tokenizer_path) {
  std::error_code ec;
  const fs::path dir = fs::is_directory(tokenizer_path, ec) ? fs::path(tokenizer_path) : fs::path(tokenizer_path).parent_path();
  std::ifstream in(dir / "tokenizer_config.json");
  std::string text(std::istreambuf_iterator<char>(in), {});
  // The chat template's markers, or the special tokens' (the whole config is searched).
  if (text.find("<|start_header_id|>") != std::string::npos) return "llama3";
  if (text.find("<|im_start|>") != std::string::npos)
    return text.find("<think>") != std::string::npos ? "qwen3" : "chatml";
  if (text.find("<|assistant|>") != std::string::npos) return text.find("<|end|>") != std::string::npos ? "phi3" : "zephyr";
  if (text.find("[INST]") != std::string::npos) return "mistral";
  return "alpaca";
}

}  // namespace strata::recipes
