// strata-tokenize: encode and decode with a tokenizer.json from the command
// line (recipes/data/tokenizer/tokenizer.h; docs/data.md).
//
//   strata-tokenize --tokenizer Llama-3.2-1B/ corpus.txt           # the ids of each line
//   strata-tokenize --tokenizer Llama-3.2-1B/ --whole corpus.txt   # the whole file as one text
//   strata-tokenize --tokenizer Llama-3.2-1B/ --decode ids.txt     # back to text
#include "strata/recipes/app/tokenize_cli.h"

int main(int argc, char** argv) { return strata::recipes::run_tokenize(argc, argv); }
