# Ruby side of the mixed-fleet tests (tests/test_fleet.c), run by a real
# Sidekiq server (6.4.1, 7.3 or 8.0) on a queue capstan reads too: classes
# that only Ruby has, so that capstan must hand their jobs back, and one
# both sides have.
require_relative 'sidekiq_setup'

# What each job leaves once it ran: SADD key jid and RPUSH key:log jid, so
# a test sees that it ran, and ran once.
module Recording
  def record(key)
    Sidekiq.redis do |c|
      c.sadd(key, jid)
      c.rpush("#{key}:log", jid)
    end
  end
end

# RubyOnlyJob key: records its run.
class RubyOnlyJob
  include Sidekiq::Worker
  include Recording

  def perform(key)
    record(key)
  end
end

# RubyFlakyJob key: fails its first run with a real Ruby error (INCR
# key:runs counts the runs), then does what RubyOnlyJob does.
class RubyFlakyJob
  include Sidekiq::Worker
  include Recording

  def perform(key)
    runs = Sidekiq.redis { |c| c.incr("#{key}:runs") }
    raise "flaky: first try" if runs.to_i == 1

    record(key)
  end
end

# RecordJob key: a class ported to C (the example plugin's RecordJob), which
# the Ruby app still has, so either side may run it: what RecordJob does in
# capstan, and SADD key:ruby jid to tell Ruby's runs apart.
class RecordJob
  include Sidekiq::Worker
  include Recording

  def perform(key)
    record(key)
    Sidekiq.redis { |c| c.sadd("#{key}:ruby", jid) }
  end
end
