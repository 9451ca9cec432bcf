// What libcapstan.so exports.
//
// The library is compiled with hidden visibility; a public header declares
// its API inside `namespace capstan CAPSTAN_API { ... }`, which exports
// every class, function and template declared there (and nothing the
// library's internals declare in namespace capstan elsewhere).
#ifndef CAPSTAN_EXPORT_H_
#define CAPSTAN_EXPORT_H_

#define CAPSTAN_API __attribute__((visibility("default")))
// A public class's private implementation (`struct CAPSTAN_HIDDEN Impl;`):
// declared in a public header, defined and used only inside the library.
#define CAPSTAN_HIDDEN __attribute__((visibility("hidden")))

#endif  // CAPSTAN_EXPORT_H_
