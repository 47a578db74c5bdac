# Ruby side of the batch tests (tests/test_batch.c), run by a real Sidekiq
# 6.4.1 server: the callback jobs kiq pushes when a batch is done.
require 'json'
require 'sidekiq'

Redis.sadd_returns_boolean = false if Redis.respond_to?(:sadd_returns_boolean=)

# BatchCallbackJob status, options: RPUSH options['key'] the status (keys
# sorted) and key:opts the options, as Ruby parsed them.
class BatchCallbackJob
  include Sidekiq::Worker

  def perform(status, options)
    Sidekiq.redis do |c|
      c.rpush(options['key'], JSON.generate(status.sort.to_h))
      c.rpush("#{options['key']}:opts", JSON.generate(options))
    end
  end
end
