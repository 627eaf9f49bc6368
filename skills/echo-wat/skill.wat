;; echo-wat: the echo skill written by hand in WebAssembly text.
;;
;; It is the smallest component that speaks the skilld ABI (skilld:skill/guest@0.1.0,
;; see src/skilld/wit/skill.wit): one method, `echo`, no imports at all. Where the
;; Python echo carries a whole CPython (18 MB, ~1.5 ms of CPU to instantiate and
;; free per call), this one instantiates in microseconds, so serving it measures
;; the host itself: the MCP layer, the registry, the policy context, the audit
;; record and the sandbox's store-per-call (bench/bench_mcp.py).
;;
;; The host calls `call("echo", args)` with args as JSON text that the MCP layer
;; already checked against the params schema, so they read {"text": <JSON string>}
;; (whitespace allowed between the tokens) and the result's JSON value is that
;; string, byte for byte: the host parses it, so a malformed escape inside comes
;; back as the host's "invalid JSON" error. Any other shape is refused with
;; `invalid-argument`, any other method with `not-found`.
;;
;; Memory map (one 64 KiB page to start; the allocator grows it):
;;   0     return area of call / read-resource / get-prompt (28 bytes)
;;   64    skill-info record (48 bytes)
;;   112   method-info record (36 bytes)
;;   1024  the constant strings below
;;   4096  the heap: a bump allocator, never freed (an instance serves one call)
(component
  ;; -- the ABI's types (src/skilld/wit/skill.wit, interface types) ----------------
  (type $error-code (enum "not-permitted" "not-found" "invalid-argument" "limit-exceeded"
                          "timeout" "unavailable" "io" "cancelled" "internal"))
  (type $error (record (field "code" $error-code) (field "message" string)
                       (field "rule" (option string))))
  (type $method-info (record (field "name" string) (field "description" string)
                             (field "params-schema" string)
                             (field "result-schema" (option string))))
  (type $resource-info (record (field "uri" string) (field "name" string)
                               (field "description" string) (field "mime-type" (option string))
                               (field "template" bool)))
  (type $prompt-info (record (field "name" string) (field "description" string)
                             (field "arguments-schema" string)))
  (type $skill-info (record (field "id" string) (field "version" string)
                            (field "description" string)
                            (field "methods" (list $method-info))
                            (field "resources" (list $resource-info))
                            (field "prompts" (list $prompt-info))))
  (type $blob (record (field "mime-type" string) (field "data" (list u8))))
  (type $embedded-resource (record (field "uri" string) (field "mime-type" (option string))
                                   (field "text" (option string))
                                   (field "blob" (option (list u8)))))
  (type $content (variant (case "text" string) (case "image" $blob) (case "audio" $blob)
                          (case "embedded" $embedded-resource)))
  (type $output (record (field "value" string) (field "content" (list $content))))

  ;; -- the code ----------------------------------------------------------------------
  (core module $guest
    (memory (export "memory") 1)
    (global $heap (mut i32) (i32.const 4096))

    (data (i32.const 1024) "echo-wat")  ;; id, 8 bytes
    (data (i32.const 1032) "0.1.0")  ;; version, 5 bytes
    (data (i32.const 1040) "Echo written in WebAssembly text: the smallest skill, for measuring the host.")  ;; description, 77 bytes
    (data (i32.const 1120) "echo")  ;; method name, 4 bytes
    (data (i32.const 1128) "Return the text unchanged.")  ;; method description, 26 bytes
    (data (i32.const 1160) "{\22additionalProperties\22:false,\22properties\22:{\22text\22:{\22description\22:\22what to echo.\22,\22type\22:\22string\22}},\22required\22:[\22text\22],\22type\22:\22object\22}")  ;; params schema, 136 bytes
    (data (i32.const 1296) "no such method")  ;; 14 bytes
    (data (i32.const 1312) "the arguments must be {\22text\22: string}")  ;; 38 bytes
    (data (i32.const 1352) "this skill serves no resources or prompts")  ;; 41 bytes
    (data (i32.const 1400) "\22text\22")  ;; the one key, 6 bytes

    ;; The canonical ABI's allocator: the host places the arguments with it.
    (func $realloc (export "cabi_realloc")
      (param $old i32) (param $old_size i32) (param $align i32) (param $size i32) (result i32)
      (local $p i32) (local $end i32) (local $have i32)
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get $align) (i32.const 1)))
                             (i32.sub (i32.const 0) (local.get $align))))
      (local.set $end (i32.add (local.get $p) (local.get $size)))
      (if (i32.lt_u (local.get $end) (local.get $p)) (then unreachable))
      (local.set $have (i32.shl (memory.size) (i32.const 16)))
      (if (i32.gt_u (local.get $end) (local.get $have))
        (then
          (if (i32.eq (memory.grow (i32.shr_u (i32.add (i32.sub (local.get $end) (local.get $have))
                                                       (i32.const 65535))
                                              (i32.const 16)))
                      (i32.const -1))
            (then unreachable))))
      (global.set $heap (local.get $end))
      (if (local.get $old_size)
        (then
          (memory.copy (local.get $p) (local.get $old)
            (select (local.get $old_size) (local.get $size)
                    (i32.lt_u (local.get $old_size) (local.get $size))))))
      (local.get $p))

    ;; result<_, error> in the return area: err(code, message at $msg, no rule).
    (func $fail (param $code i32) (param $msg i32) (param $len i32) (result i32)
      (i32.store8 (i32.const 0) (i32.const 1))
      (i32.store8 (i32.const 4) (local.get $code))
      (i32.store (i32.const 8) (local.get $msg))
      (i32.store (i32.const 12) (local.get $len))
      (i32.store8 (i32.const 16) (i32.const 0))
      (i32.const 0))

    ;; The byte at $p, or -1 at the end of the input.
    (func $byte (param $p i32) (param $end i32) (result i32)
      (if (result i32) (i32.lt_u (local.get $p) (local.get $end))
        (then (i32.load8_u (local.get $p)))
        (else (i32.const -1))))

    ;; The first position at or after $p that is not JSON whitespace.
    (func $ws (param $p i32) (param $end i32) (result i32)
      (local $c i32)
      (block $done
        (loop $next
          (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
          (local.set $c (i32.load8_u (local.get $p)))
          (br_if $done (i32.and (i32.ne (local.get $c) (i32.const 0x20))
                                (i32.and (i32.ne (local.get $c) (i32.const 0x0a))
                                         (i32.and (i32.ne (local.get $c) (i32.const 0x0d))
                                                  (i32.ne (local.get $c) (i32.const 0x09))))))
          (local.set $p (i32.add (local.get $p) (i32.const 1)))
          (br $next)))
      (local.get $p))

    (func (export "describe") (result i32)
      ;; skill-info at 64: id, version, description, methods (1 at 112), no resources, no prompts
      (i32.store (i32.const 64) (i32.const 1024)) (i32.store (i32.const 68) (i32.const 8))
      (i32.store (i32.const 72) (i32.const 1032)) (i32.store (i32.const 76) (i32.const 5))
      (i32.store (i32.const 80) (i32.const 1040)) (i32.store (i32.const 84) (i32.const 77))
      (i32.store (i32.const 88) (i32.const 112)) (i32.store (i32.const 92) (i32.const 1))
      (i32.store (i32.const 96) (i32.const 0)) (i32.store (i32.const 100) (i32.const 0))
      (i32.store (i32.const 104) (i32.const 0)) (i32.store (i32.const 108) (i32.const 0))
      ;; method-info at 112: name, description, params schema, no result schema
      (i32.store (i32.const 112) (i32.const 1120)) (i32.store (i32.const 116) (i32.const 4))
      (i32.store (i32.const 120) (i32.const 1128)) (i32.store (i32.const 124) (i32.const 26))
      (i32.store (i32.const 128) (i32.const 1160)) (i32.store (i32.const 132) (i32.const 136))
      (i32.store8 (i32.const 136) (i32.const 0))
      (i32.const 64))

    (func (export "call") (param $m i32) (param $mlen i32) (param $a i32) (param $alen i32)
      (result i32)
      (local $s i32) (local $slen i32) (local $p i32) (local $end i32) (local $c i32)
      ;; the method must be "echo" (the length first: a shorter name may end the memory)
      (if (i32.ne (local.get $mlen) (i32.const 4))
        (then (return (call $fail (i32.const 1) (i32.const 1296) (i32.const 14)))))
      (if (i32.ne (i32.load align=1 (local.get $m)) (i32.load (i32.const 1120)))
        (then (return (call $fail (i32.const 1) (i32.const 1296) (i32.const 14)))))
      (block $bad
        ;; args: { "text" : <JSON string> }, with any JSON whitespace between the tokens
        (local.set $end (i32.add (local.get $a) (local.get $alen)))
        (local.set $p (call $ws (local.get $a) (local.get $end)))
        (br_if $bad (i32.ne (call $byte (local.get $p) (local.get $end)) (i32.const 0x7b)))  ;; {
        (local.set $p (call $ws (i32.add (local.get $p) (i32.const 1)) (local.get $end)))
        (br_if $bad (i32.lt_u (i32.sub (local.get $end) (local.get $p)) (i32.const 6)))
        (br_if $bad (i32.ne (i32.load align=1 (local.get $p)) (i32.load (i32.const 1400))))  ;; "tex
        (br_if $bad (i32.ne (i32.load16_u align=1 (i32.add (local.get $p) (i32.const 4)))
                            (i32.load16_u (i32.const 1404))))  ;; t"
        (local.set $p (call $ws (i32.add (local.get $p) (i32.const 6)) (local.get $end)))
        (br_if $bad (i32.ne (call $byte (local.get $p) (local.get $end)) (i32.const 0x3a)))  ;; :
        (local.set $s (call $ws (i32.add (local.get $p) (i32.const 1)) (local.get $end)))
        (br_if $bad (i32.ne (call $byte (local.get $s) (local.get $end)) (i32.const 0x22)))  ;; "
        ;; the string runs to the first quote not escaped by a backslash
        (local.set $p (i32.add (local.get $s) (i32.const 1)))
        (block $closed
          (loop $scan
            (br_if $bad (i32.ge_u (local.get $p) (local.get $end)))
            (local.set $c (i32.load8_u (local.get $p)))
            (br_if $closed (i32.eq (local.get $c) (i32.const 0x22)))
            (local.set $p (i32.add (local.get $p)
                                   (select (i32.const 2) (i32.const 1)
                                           (i32.eq (local.get $c) (i32.const 0x5c)))))
            (br $scan)))
        (local.set $slen (i32.sub (i32.add (local.get $p) (i32.const 1)) (local.get $s)))
        (local.set $p (call $ws (i32.add (local.get $p) (i32.const 1)) (local.get $end)))
        (br_if $bad (i32.ne (call $byte (local.get $p) (local.get $end)) (i32.const 0x7d)))  ;; }
        (br_if $bad (i32.ne (call $ws (i32.add (local.get $p) (i32.const 1)) (local.get $end))
                            (local.get $end)))
        ;; ok(output { value: the string, content: [] })
        (i32.store8 (i32.const 0) (i32.const 0))
        (i32.store (i32.const 4) (local.get $s))
        (i32.store (i32.const 8) (local.get $slen))
        (i32.store (i32.const 12) (i32.const 0))
        (i32.store (i32.const 16) (i32.const 0))
        (return (i32.const 0)))
      (call $fail (i32.const 2) (i32.const 1312) (i32.const 38)))

    (func (export "read-resource") (param i32 i32) (result i32)
      (call $fail (i32.const 1) (i32.const 1352) (i32.const 41)))

    (func (export "get-prompt") (param i32 i32 i32 i32) (result i32)
      (call $fail (i32.const 1) (i32.const 1352) (i32.const 41))))

  (core instance $g (instantiate $guest))

  (func $describe (result $skill-info)
    (canon lift (core func $g "describe") (memory (core memory $g "memory"))
                (realloc (core func $g "cabi_realloc"))))
  (func $call (param "method" string) (param "args" string) (result (result $output (error $error)))
    (canon lift (core func $g "call") (memory (core memory $g "memory"))
                (realloc (core func $g "cabi_realloc"))))
  (func $read-resource (param "uri" string) (result (result (list $output) (error $error)))
    (canon lift (core func $g "read-resource") (memory (core memory $g "memory"))
                (realloc (core func $g "cabi_realloc"))))
  (func $get-prompt (param "name" string) (param "args" string) (result (result string (error $error)))
    (canon lift (core func $g "get-prompt") (memory (core memory $g "memory"))
                (realloc (core func $g "cabi_realloc"))))

  (component $shim
    ;; every type, imported under a name (the definitions are the outer ones)
    (type $d-error-code (enum "not-permitted" "not-found" "invalid-argument" "limit-exceeded" "timeout" "unavailable" "io" "cancelled" "internal"))
    (import "import-type-error-code" (type $i-error-code (eq $d-error-code)))
    (type $d-error (record (field "code" $i-error-code) (field "message" string) (field "rule" (option string))))
    (import "import-type-error" (type $i-error (eq $d-error)))
    (type $d-method-info (record (field "name" string) (field "description" string) (field "params-schema" string) (field "result-schema" (option string))))
    (import "import-type-method-info" (type $i-method-info (eq $d-method-info)))
    (type $d-resource-info (record (field "uri" string) (field "name" string) (field "description" string) (field "mime-type" (option string)) (field "template" bool)))
    (import "import-type-resource-info" (type $i-resource-info (eq $d-resource-info)))
    (type $d-prompt-info (record (field "name" string) (field "description" string) (field "arguments-schema" string)))
    (import "import-type-prompt-info" (type $i-prompt-info (eq $d-prompt-info)))
    (type $d-skill-info (record (field "id" string) (field "version" string) (field "description" string) (field "methods" (list $i-method-info)) (field "resources" (list $i-resource-info)) (field "prompts" (list $i-prompt-info))))
    (import "import-type-skill-info" (type $i-skill-info (eq $d-skill-info)))
    (type $d-blob (record (field "mime-type" string) (field "data" (list u8))))
    (import "import-type-blob" (type $i-blob (eq $d-blob)))
    (type $d-embedded-resource (record (field "uri" string) (field "mime-type" (option string)) (field "text" (option string)) (field "blob" (option (list u8)))))
    (import "import-type-embedded-resource" (type $i-embedded-resource (eq $d-embedded-resource)))
    (type $d-content (variant (case "text" string) (case "image" $i-blob) (case "audio" $i-blob) (case "embedded" $i-embedded-resource)))
    (import "import-type-content" (type $i-content (eq $d-content)))
    (type $d-output (record (field "value" string) (field "content" (list $i-content))))
    (import "import-type-output" (type $i-output (eq $d-output)))
    (import "import-func-describe" (func $f-describe (result $i-skill-info)))
    (import "import-func-call" (func $f-call (param "method" string) (param "args" string) (result (result $i-output (error $i-error)))))
    (import "import-func-read-resource" (func $f-read-resource (param "uri" string) (result (result (list $i-output) (error $i-error)))))
    (import "import-func-get-prompt" (func $f-get-prompt (param "name" string) (param "args" string) (result (result string (error $i-error)))))
    ;; and exported under the ABI's names, described in terms of the exports
    (type $x-error-code (enum "not-permitted" "not-found" "invalid-argument" "limit-exceeded" "timeout" "unavailable" "io" "cancelled" "internal"))
    (export $e-error-code "error-code" (type $i-error-code) (type (eq $x-error-code)))
    (type $x-error (record (field "code" $e-error-code) (field "message" string) (field "rule" (option string))))
    (export $e-error "error" (type $i-error) (type (eq $x-error)))
    (type $x-method-info (record (field "name" string) (field "description" string) (field "params-schema" string) (field "result-schema" (option string))))
    (export $e-method-info "method-info" (type $i-method-info) (type (eq $x-method-info)))
    (type $x-resource-info (record (field "uri" string) (field "name" string) (field "description" string) (field "mime-type" (option string)) (field "template" bool)))
    (export $e-resource-info "resource-info" (type $i-resource-info) (type (eq $x-resource-info)))
    (type $x-prompt-info (record (field "name" string) (field "description" string) (field "arguments-schema" string)))
    (export $e-prompt-info "prompt-info" (type $i-prompt-info) (type (eq $x-prompt-info)))
    (type $x-skill-info (record (field "id" string) (field "version" string) (field "description" string) (field "methods" (list $e-method-info)) (field "resources" (list $e-resource-info)) (field "prompts" (list $e-prompt-info))))
    (export $e-skill-info "skill-info" (type $i-skill-info) (type (eq $x-skill-info)))
    (type $x-blob (record (field "mime-type" string) (field "data" (list u8))))
    (export $e-blob "blob" (type $i-blob) (type (eq $x-blob)))
    (type $x-embedded-resource (record (field "uri" string) (field "mime-type" (option string)) (field "text" (option string)) (field "blob" (option (list u8)))))
    (export $e-embedded-resource "embedded-resource" (type $i-embedded-resource) (type (eq $x-embedded-resource)))
    (type $x-content (variant (case "text" string) (case "image" $e-blob) (case "audio" $e-blob) (case "embedded" $e-embedded-resource)))
    (export $e-content "content" (type $i-content) (type (eq $x-content)))
    (type $x-output (record (field "value" string) (field "content" (list $e-content))))
    (export $e-output "output" (type $i-output) (type (eq $x-output)))
    (export "describe" (func $f-describe) (func (result $e-skill-info)))
    (export "call" (func $f-call) (func (param "method" string) (param "args" string) (result (result $e-output (error $e-error)))))
    (export "read-resource" (func $f-read-resource) (func (param "uri" string) (result (result (list $e-output) (error $e-error)))))
    (export "get-prompt" (func $f-get-prompt) (func (param "name" string) (param "args" string) (result (result string (error $e-error)))))
  )
  (instance $iface (instantiate $shim
    (with "import-type-error-code" (type $error-code))
    (with "import-type-error" (type $error))
    (with "import-type-method-info" (type $method-info))
    (with "import-type-resource-info" (type $resource-info))
    (with "import-type-prompt-info" (type $prompt-info))
    (with "import-type-skill-info" (type $skill-info))
    (with "import-type-blob" (type $blob))
    (with "import-type-embedded-resource" (type $embedded-resource))
    (with "import-type-content" (type $content))
    (with "import-type-output" (type $output))
    (with "import-func-describe" (func $describe))
    (with "import-func-call" (func $call))
    (with "import-func-read-resource" (func $read-resource))
    (with "import-func-get-prompt" (func $get-prompt))
  ))
  (export "skilld:skill/guest@0.1.0" (instance $iface)))
