// C++ consumer: plans the upload of a conformance "upload" fixture (read at run time,
// path in argv[1]) through the C++ RAII wrapper and compares the manifest digest, the
// manifest bytes, the keys and the operations with the fixture's expectations.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "mooncake_weight_store.hpp"
#include "support/fixture.h"
#include "support/mini_json.h"

namespace {

int failures = 0;

void expect(const char *what, std::string_view actual, const char *expected) {
    if (expected == nullptr || actual != expected) {
        ++failures;
        std::cerr << "mismatch in " << what << ":\n  actual:   " << actual
                  << "\n  expected: " << (expected ? expected : "(null)") << "\n";
    }
}

void expect(const char *what, std::uint64_t actual, std::uint64_t expected) {
    if (actual != expected) {
        ++failures;
        std::cerr << "mismatch in " << what << ": " << actual << " != " << expected << "\n";
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::cerr << "usage: " << argv[0] << " FIXTURE.json\n";
        return 2;
    }
    std::size_t len = 0;
    std::unique_ptr<char, decltype(&std::free)> text(mj_read_file(argv[1], &len), &std::free);
    if (!text) {
        std::cerr << "cannot read " << argv[1] << "\n";
        return 2;
    }
    std::unique_ptr<mj_value, decltype(&mj_free)> doc(mj_parse(text.get(), len), &mj_free);
    const mj_value *inputs = mj_get(doc.get(), "inputs");
    const mj_value *expected = mj_get(doc.get(), "expected");
    const mj_value *jplacement = mj_get(inputs, "placement");
    const mj_value *jbindings = mj_get(inputs, "bindings");
    if (jplacement == nullptr || jbindings == nullptr || expected == nullptr) {
        std::cerr << argv[1] << " is not an upload fixture\n";
        return 2;
    }
    try {
        auto placement = mws::Placement::from_json(
            std::string_view(text.get() + jplacement->begin, jplacement->end - jplacement->begin));
        std::vector<mws::Binding> bindings;
        for (std::size_t i = 0; i < jbindings->count; ++i) {
            const mj_value *jb = jbindings->items[i];
            mws::BindingOptions o;
            o.resource_id = mj_str(jb, "resource_id");
            o.revision = mj_str(jb, "revision");
            o.placement_id = mj_str(jb, "placement_id");
            o.placement_digest = mj_str(jb, "placement_digest");
            o.participant_id = mj_str(jb, "participant_id");
            o.instance_id = mj_str(jb, "instance_id");
            o.lease_id = mj_str(jb, "lease_id");
            o.lease_generation = mj_u64(jb, "generation");
            mws::Binding binding(o);
            const mj_value *frags = mj_get(jb, "fragments");
            for (std::size_t k = 0; frags != nullptr && k < frags->count; ++k) {
                fixture_fragment f;
                if (!fixture_fragment_from_json(frags->items[k], &f)) {
                    std::cerr << "malformed fragment in the fixture\n";
                    return 2;
                }
                binding.add_fragment(f.f);
            }
            binding.validate(placement);
            bindings.push_back(std::move(binding));
        }
        mws::UploadOptions options;
        options.store_namespace = mj_str(inputs, "namespace");
        options.key_prefix = mj_str(inputs, "key_prefix");
        options.transaction_id = mj_str(inputs, "transaction_id");
        options.created_at = mj_str(inputs, "created_at");
        mws::UploadPlan plan = mws::plan_upload(placement, bindings, options);

        expect("manifest_digest", plan.manifest_digest(), mj_str(expected, "manifest_digest"));
        expect("manifest_json", plan.manifest_json(), mj_str(expected, "manifest_json"));
        expect("group_id", plan.group_id(), mj_str(expected, "group_id"));
        expect("manifest_key", plan.manifest_key(), mj_str(expected, "manifest_key"));
        expect("transaction_group_id", plan.transaction_group_id(), mj_str(expected, "transaction_group_id"));
        expect("control_key", plan.control_key(), mj_str(expected, "control_key"));
        expect("source_placement_id", plan.source_placement_id(), mj_str(expected, "source_placement_id"));
        expect("source_placement_digest", plan.source_placement_digest(),
               mj_str(expected, "source_placement_digest"));
        expect("decision_commit_record", plan.commit_record(), mj_str(expected, "decision_commit_record"));
        const mj_value *ops = mj_get(expected, "operations");
        expect("operation count", plan.operation_count(), ops ? ops->count : 0);
        for (std::size_t i = 0; ops != nullptr && i < ops->count && i < plan.operation_count(); ++i) {
            const mj_value *e = ops->items[i];
            mws::UploadOperation op = plan.operation(i);
            expect("source_participant_id", op.source_participant_id, mj_str(e, "source_participant_id"));
            expect("source_instance_id", op.source_instance_id, mj_str(e, "source_instance_id"));
            expect("source_lease_id", op.source_lease_id, mj_str(e, "source_lease_id"));
            expect("source_generation", op.source_lease_generation, mj_u64(e, "source_generation"));
            expect("source_fragment_id", op.source_fragment_id, mj_str(e, "source_fragment_id"));
            expect("source_worker_id", op.source_worker_id, mj_str(e, "source_worker_id"));
            expect("source_placement_fragment_id", op.source_placement_fragment_id,
                   mj_str(e, "source_placement_fragment_id"));
            expect("target_fragment_id", op.target_fragment_id, mj_str(e, "target_fragment_id"));
            expect("object_key", op.object_key, mj_str(e, "object_key"));
            expect("nbytes", op.nbytes, mj_u64(e, "nbytes"));
        }
        std::cout << argv[1] << ": manifest digest " << plan.manifest_digest() << " ("
                  << (failures == 0 ? "matches" : "MISMATCH") << ")\n";
    } catch (const mws::Error &e) {
        std::cerr << "mws::Error: " << e.what() << "\n";
        return 1;
    }
    return failures == 0 ? 0 : 1;
}
