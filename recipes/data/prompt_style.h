#pragma once
// Prompt styles for instruction fine-tuning: how a record's conversation
// becomes text, and which parts of it are trained (the assistant's answers
// and their end markers; with --mask-prompt false everything).
//
// Styles (strata renders each itself; it does not run tokenizer_config.json's
// Jinja chat_template, whose markers pick the style by default and whose
// output tests/recipes/data/instruct_test.cpp compares with):
//   alpaca   Stanford Alpaca's prompt (lit-gpt's Alpaca style), EOS after the answer
//   llama3   <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
//   chatml   <|im_start|>role\ncontent<|im_end|>\n (Qwen)
//   mistral  <s>[INST] user [/INST]answer</s>
//   zephyr   <|user|>\ncontent</s>\n<|assistant|>\n... (TinyLlama-Chat)
//   phi3     <|user|>\ncontent<|end|>\n<|assistant|>\n...<|end|>\n<|endoftext|>
#include <memory>
#include <string>
#include <vector>

namespace strata::recipes {

struct ChatMessage {
  std::string role;  ///< system, user or assistant
  std::string content;
};

/// One instruction record: Alpaca's fields, or chat messages.
struct InstructRecord {
  std::string instruction, input, output;  ///< Alpaca ("" in a chat record)
  std::vector<ChatMessage> messages;       ///< chat (empty in an Alpaca record)
  /// The conversation: the messages, or an Alpaca record as a user turn
  /// (instruction, and input after a blank line) and the answer.
  std::vector<ChatMessage> conversation() const;
};

/// A piece of rendered text and whether its tokens are trained.
struct PromptSegment {
  std::string text;
  bool trained = false;
};

class PromptStyle {
 public:
  virtual ~PromptStyle() = default;
  virtual std::string name() const = 0;
  /// `record` as text pieces; the style's EOS, where it appends the token
  /// rather than writing it, is left to the caller (appends_eos()).
  virtual std::vector<PromptSegment> render(const InstructRecord& record) const = 0;
  /// Whether the tokenizer's EOS token follows the last trained segment.
  virtual bool appends_eos() const { return false; }
  /// The text a model answers from: `messages` (system and user turns, and
  /// earlier answers) and the opening of the assistant's turn, as
  /// transformers' apply_chat_template(..., add_generation_prompt=True) writes it.
  virtual std::string generation_prompt(const std::vector<ChatMessage>& messages) const = 0;
  /// Whether that text begins with the BOS token itself (else the
  /// tokenizer's post-processor adds it).
  virtual bool writes_bos() const { return false; }
};

/// alpaca, llama3, chatml, mistral, zephyr or phi3; c10::ValueError naming
/// the value and those allowed.
std::unique_ptr<PromptStyle> make_prompt_style(const std::string& name);
std::vector<std::string> prompt_style_names();

/// The style a tokenizer's model uses: its chat template's or its special
/// tokens' markers (tokenizer_config.json beside `tokenizer_path`), else alpaca.
std::string prompt_style_for(const std::string& tokenizer_path);

}  // namespace strata::recipes
