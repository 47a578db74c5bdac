# Ruby side of the batch tests (tests/test_batch.c), run by a real Sidekiq
# server (6.4.1, 7.3 or 8.0): the callback jobs capstan pushes when a batch is
# done, and jobs of batches that Sidekiq runs (examples/ruby/capstan_batch.rb
# counts them).
require 'json'
require 'sidekiq'
require_relative '../../examples/ruby/capstan_batch'

Redis.sadd_returns_boolean = false if defined?(Redis) && Redis.respond_to?(:sadd_returns_boolean=)

# BatchCallbackJob status, options: RPUSH key:opts the options, as Ruby parsed
# them, then options['key'] the status (keys sorted): a test that waits for
# the status finds the options already there.
class BatchCallbackJob
  include Sidekiq::Worker

  def perform(status, options)
    Sidekiq.redis do |c|
      c.rpush("#{options['key']}:opts", JSON.generate(options))
      c.rpush(options['key'], JSON.generate(status.sort.to_h))
    end
  end
end

# RubyRecordJob key: SADD key jid, and HSET key:bids jid its batch's bid
# (Capstan::Batch::Member).
class RubyRecordJob
  include Sidekiq::Worker
  include Capstan::Batch::Member

  def perform(key)
    Sidekiq.redis do |c|
      c.sadd(key, jid)
      c.hset("#{key}:bids", jid, bid.to_s)
    end
  end
end

# RubyDyingJob: fails, with no retries left: dead at once.
class RubyDyingJob
  include Sidekiq::Worker
  sidekiq_options retry: 0

  def perform
    raise ArgumentError, 'RubyDyingJob always fails'
  end
end
