#pragma once
// strata-tokenize's main (recipes/app/main_tokenize.cpp).
//
// strata-tokenize --tokenizer PATH FILE prints the ids of each line of FILE
// (the line without its "\n", no special tokens added), space-separated, one
// output line per input line; --whole encodes the whole file as one text and
// prints its ids on one line; --decode reads such lines back (one text per
// line; with --whole, all the ids as one text, printed as it is). FILE "-"
// (or none) is stdin. Lines are encoded on --threads threads (default: every
// core). Bad input (a tokenizer that does not load, a FILE that is not
// UTF-8, an id out of range): one line naming the file, line and value on
// stderr, exit 2, nothing on stdout.
namespace strata::recipes {

int run_tokenize(int argc, char** argv);

}  // namespace strata::recipes
