#include "server/client_text.h"

#include <gtest/gtest.h>

#include <string>

namespace tigon::server {
namespace {

TEST(ClientText, PlainTextIsUnchanged) {
  EXPECT_EQ(ClientText("s-00ff run/step-10 über 日本"), "s-00ff run/step-10 über 日本");
  EXPECT_EQ(ClientText(""), "");
}

TEST(ClientText, ControlCharactersCannotForgeALine) {
  const std::string forged = ClientText("s-1\n[2026-01-01 00:00:00.000] [info] session s-2 closed\r\x1b[2J\x7f");
  EXPECT_EQ(forged.find('\n'), std::string::npos);
  EXPECT_EQ(forged.find('\r'), std::string::npos);
  EXPECT_EQ(forged.find('\x1b'), std::string::npos);
  EXPECT_EQ(forged, "s-1\\n[2026-01-01 00:00:00.000] [info] session s-2 closed\\r\\x1B[2J\\x7F");
  EXPECT_EQ(ClientText(std::string("a\0b\tc", 5)), "a\\x00b\\tc");
}

TEST(ClientText, InvalidUtf8AndInvisibleCharactersAreEscaped) {
  EXPECT_EQ(ClientText("\xff\xfe"), "\\xFF\\xFE");
  EXPECT_EQ(ClientText("\xc0\xaf"), "\\xC0\\xAF") << "overlong '/'";
  EXPECT_EQ(ClientText("\xed\xa0\x80"), "\\xED\\xA0\\x80") << "a surrogate";
  EXPECT_EQ(ClientText("a\xe2\x80\xae" "b"), "a\\u202Eb") << "right-to-left override";
  EXPECT_EQ(ClientText("\xe2\x80\xa8"), "\\u2028") << "line separator";
  EXPECT_EQ(ClientText("\xc2\x85"), "\\u0085") << "C1 next line";
  EXPECT_EQ(ClientText("\xe6\x97"), "\\xE6\\x97") << "a cut sequence";
}

TEST(ClientText, LongTextIsCutWithItsLength) {
  const std::string megabyte(1 << 20, 'x');
  const std::string shown = ClientText(megabyte);
  EXPECT_LE(shown.size(), kClientTextLimit + 32);
  EXPECT_NE(shown.find("...[1048576 bytes]"), std::string::npos);
  // Never in the middle of a character or an escape.
  const std::string wide = ClientText(std::string(300, '\n'), 9);
  EXPECT_EQ(wide.substr(0, 8), "\\n\\n\\n\\n");
  EXPECT_EQ(wide.substr(8, 1), " ");
  EXPECT_EQ(ClientText("ééééé", 5).substr(0, 4), "éé");
}

TEST(ClientText, ApplyingItTwiceChangesNothing) {
  for (const std::string& text : {std::string("a\nb\xff\xe2\x80\xae"), std::string("plain"), std::string(50, '\t')}) {
    const std::string once = ClientText(text);
    EXPECT_EQ(ClientText(once), once);
  }
}

}  // namespace
}  // namespace tigon::server
